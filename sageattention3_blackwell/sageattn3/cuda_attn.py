"""The compiled CUDA kernels (sageattn3._C): sm_100a tcgen05 and sm_120a/sm_121a mma.sync."""
from .prepare import QuantizedInputs


def attention_cuda(qi: QuantizedInputs, is_causal: bool, sm_scale: float):
    """Same contract as reference.attention_reference."""
    from . import _C
    out, lse = _C.attention(qi.q_codes, qi.q_scales, qi.k_codes, qi.k_scales, qi.v_codes, qi.v_scales,
                            qi.q_bias, qi.n_k, sm_scale, is_causal)
    return out[:, :, :qi.n_q, :qi.head_dim], lse[:, :, :qi.n_q]
