"""torch.library registration of the compiled kernels (sageattn3._C) with a fake implementation, so that
torch.compile(fullgraph=True) traces through backend="cuda" without a graph break."""
from typing import Optional

import torch


def _attention(
    q_codes: torch.Tensor, q_scales: torch.Tensor, k_codes: torch.Tensor, k_scales: torch.Tensor,
    v_codes: torch.Tensor, v_scales: torch.Tensor, q_bias: Optional[torch.Tensor], n_k: int, scales: torch.Tensor,
    causal: bool, causal_offset: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    from . import _C
    out, lse = _C.attention(q_codes, q_scales, k_codes, k_scales, v_codes, v_scales, q_bias, n_k, scales, causal,
                            causal_offset)
    return out, lse


attention = torch.library.custom_op("sageattn3::attention", _attention, mutates_args=())


@attention.register_fake
def _attention_fake(q_codes, q_scales, k_codes, k_scales, v_codes, v_scales, q_bias, n_k, scales, causal,
                    causal_offset):
    # The kernels write out [B, H, padded Nq, D] and lse [B, H, padded Nq] in float32 (csrc/bindings.cpp).
    b, h, n_q_pad, half_d = q_codes.shape
    return (q_codes.new_empty((b, h, n_q_pad, 2 * half_d), dtype=torch.float32),
            q_codes.new_empty((b, h, n_q_pad), dtype=torch.float32))


def run_attention(*args):
    """Eager calls skip the dispatcher (it costs tens of microseconds); compiled graphs see the op."""
    return attention(*args) if torch.compiler.is_compiling() else _attention(*args)
