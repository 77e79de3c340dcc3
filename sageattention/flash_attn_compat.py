"""sageattention behind the calling conventions that sequence-parallel engines already speak.

- `flash_attn_func`: flash-attn's `flash_attn_func` (NHD tensors [B, S, H, D]; causal aligned bottom-right).
- `flash_attn_forward`: the per-block call of ring-attention loops (yunchang's `fwd-only` kernels), which always
  returns (out, lse) for the loop to merge.
- `scaled_dot_product_attention`: PyTorch's SDPA keywords (HND tensors [B, H, S, D]), for engines that take an
  SDPA-like `attn_func` (para-attn).

Each takes every argument of its convention, honours what sageattention computes (causal masks, the softmax scale,
GQA/MQA, fp16/bf16, head_dim <= 256) and raises a ValueError naming any argument whose value it cannot honour
(dropout, sliding windows, soft-capping, ALiBi, returned probabilities), so an engine fails loudly instead of computing
other attention. LSE: natural log, fp32, [B, Hq, Sq]; a row that sees no key gives out 0 and LSE -inf (flash-attn 2
writes +inf there). `kernel` picks the public function that runs (default `sageattn`); further keyword arguments go
to it, which refuses the ones it does not know. The public functions themselves keep their upstream signatures.
"""
from __future__ import annotations

from . import core, inputs

# the public functions that take attn_mask, hence a bottom-right causal mask when Sq != Sk
_MASKABLE = (core.sageattn, core.sageattn_qk_int8_pv_fp16_triton)


def _check_flash_args(dropout_p, window_size, softcap, alibi_slopes) -> None:
    inputs.check_dropout(dropout_p)
    if tuple(window_size) != (-1, -1):
        raise ValueError(f"window_size={tuple(window_size)} is not supported: sageattention has no sliding-window "
                         "(local) attention; use (-1, -1)")
    if softcap not in (0, None):
        raise ValueError(f"softcap={softcap} is not supported: sageattention does not soft-cap scores; use 0.0")
    if alibi_slopes is not None:
        raise ValueError("alibi_slopes is not supported: sageattention has no ALiBi bias; use None")


def _flash_call(q, k, v, softmax_scale, causal, return_lse, kernel, kernel_kwargs):
    kernel = kernel or core.sageattn
    _, _, _, nq, nk = inputs.check_dense(q, k, v, "NHD")
    if causal and nq != nk:  # flash-attn aligns the causal mask bottom-right: query i sees keys j <= i + Sk - Sq
        if kernel not in _MASKABLE:
            raise ValueError(f"causal=True with {nq} queries and {nk} keys needs a bottom-right causal mask, which "
                             f"{kernel.__name__} cannot take; use sageattn or sageattn_qk_int8_pv_fp16_triton")
        from torch.nn.attention.bias import causal_lower_right  # (loads Triton: only when needed)

        kernel_kwargs = dict(kernel_kwargs, attn_mask=causal_lower_right(nq, nk))
        causal = False
    return kernel(q, k, v, tensor_layout="NHD", is_causal=bool(causal), sm_scale=softmax_scale, return_lse=return_lse,
                  **kernel_kwargs)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False, *, kernel=None, **kernel_kwargs):
    """flash-attn's `flash_attn_func` on sageattention: q [B, Sq, Hq, D], k/v [B, Sk, Hk, D] (Hk divides Hq).

    causal=True is bottom-right aligned, as flash-attn (query i sees keys j <= i + Sk - Sq; the same as top-left
    when Sq == Sk). softmax_scale None: 1/sqrt(D). deterministic is accepted (in flash-attn it concerns only the
    backward pass). Returns out [B, Sq, Hq, D], or with return_attn_probs=True (out, lse [B, Hq, Sq] fp32, None):
    the attention probabilities are never formed, so the third item is None."""
    _check_flash_args(dropout_p, window_size, softcap, alibi_slopes)
    res = _flash_call(q, k, v, softmax_scale, causal, bool(return_attn_probs), kernel, kernel_kwargs)
    return (*res, None) if return_attn_probs else res


def flash_attn_forward(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                       alibi_slopes=None, return_softmax=False, *, kernel=None, **kernel_kwargs):
    """One block of a ring-attention loop, called as ring loops call flash-attn's forward: `flash_attn_func`'s
    arguments with `return_softmax` (must be False), always returning (out [B, Sq, Hq, D], lse [B, Hq, Sq] fp32),
    the pair that yunchang's `update_out_and_lse` and PyTorch's ring merger combine."""
    _check_flash_args(dropout_p, window_size, softcap, alibi_slopes)
    if return_softmax:
        raise ValueError("return_softmax=True is not supported: sageattention never forms the attention "
                         "probabilities; use False")
    return _flash_call(q, k, v, softmax_scale, causal, True, kernel, kernel_kwargs)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False, *, kernel=None, **kernel_kwargs):
    """`torch.nn.functional.scaled_dot_product_attention`'s arguments on sageattention: [B, H, S, D] tensors,
    is_causal top-left as SDPA, attn_mask bool (True = attend) or additive, scale None: 1/sqrt(D). GQA/MQA is
    served whatever enable_gqa says. Returns out like query."""
    inputs.check_dropout(dropout_p)
    if attn_mask is not None:
        kernel_kwargs = dict(kernel_kwargs, attn_mask=attn_mask)
    return (kernel or core.sageattn)(query, key, value, tensor_layout="HND", is_causal=bool(is_causal), sm_scale=scale,
                                     **kernel_kwargs)
