"""The compiled kernels' operators, torch.ops.sageattn3.*: their schemas and fake implementations (so that
torch.compile(fullgraph=True) traces backend="cuda" without a graph break). Importing sageattn3._C registers
their CUDA kernels (csrc/bindings.cpp), in the stable-ABI build and in the version-specific one alike."""
import torch

# The one declaration of each schema: the C++ side registers kernels only.
torch.library.define("sageattn3::quantize", "(Tensor x) -> (Tensor, Tensor)")
torch.library.define(
    "sageattn3::attention",
    "(Tensor q_codes, Tensor q_scales, Tensor k_codes, Tensor k_scales, Tensor v_codes, Tensor v_scales, "
    "Tensor? q_bias, int n_k, Tensor scales, bool causal, int causal_offset) -> (Tensor, Tensor)")


@torch.library.register_fake("sageattn3::quantize")
def _quantize_fake(x):
    # float32 [..., L] -> codes uint8 [..., L/2], scales float8_e4m3fn [..., L/16] (csrc/bindings.cpp).
    return (x.new_empty((*x.shape[:-1], x.shape[-1] // 2), dtype=torch.uint8),
            x.new_empty((*x.shape[:-1], x.shape[-1] // 16), dtype=torch.float8_e4m3fn))


@torch.library.register_fake("sageattn3::attention")
def _attention_fake(q_codes, q_scales, k_codes, k_scales, v_codes, v_scales, q_bias, n_k, scales, causal,
                    causal_offset):
    # The kernels write out [B, H, padded Nq, D] and lse [B, H, padded Nq] in float32 (csrc/bindings.cpp).
    b, h, n_q_pad, half_d = q_codes.shape
    return (q_codes.new_empty((b, h, n_q_pad, 2 * half_d), dtype=torch.float32),
            q_codes.new_empty((b, h, n_q_pad), dtype=torch.float32))


def run_attention(*args):
    """The attention kernels on prepare.py's operands (sageattn3._C loaded: dispatch checks it first)."""
    return torch.ops.sageattn3.attention.default(*args)
