"""The compiled CUDA kernels (sageattn3._C): sm_100a tcgen05 and sm_120a/sm_121a mma.sync."""
from . import ops
from .prepare import QuantizedInputs, kernel_scales


def attention_cuda(qi: QuantizedInputs, is_causal: bool, sm_scale: float, causal_offset: int = 0):
    """Same contract as reference.attention_reference."""
    out, lse = ops.run_attention(qi.q_codes, qi.q_scales, qi.k_codes, qi.k_scales, qi.v_codes, qi.v_scales,
                                 qi.q_bias, qi.n_k, kernel_scales(qi, sm_scale), is_causal, causal_offset)
    return out[:, :, :qi.n_q, :qi.head_dim], lse[:, :, :qi.n_q]
