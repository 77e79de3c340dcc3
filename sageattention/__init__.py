"""sageattention: quantized attention (INT8 Q·K, FP16/FP8 P·V) for PyTorch, API-compatible with SageAttention 2.2."""
from .core import (
    explain,
    sageattn,
    sageattn_qk_int8_pv_fp8_cuda,
    sageattn_qk_int8_pv_fp8_cuda_sm90,
    sageattn_qk_int8_pv_fp16_cuda,
    sageattn_qk_int8_pv_fp16_triton,
    sageattn_varlen,
)
from .fallback import set_sdpa_fallback
from . import flash_attn_compat  # flash-attn / SDPA calling conventions for sequence-parallel engines

__version__ = "2.2.0"
__all__ = [
    "sageattn",
    "sageattn_varlen",
    "explain",
    "set_sdpa_fallback",
    "flash_attn_compat",
    "sageattn_qk_int8_pv_fp16_triton",
    "sageattn_qk_int8_pv_fp16_cuda",
    "sageattn_qk_int8_pv_fp8_cuda",
    "sageattn_qk_int8_pv_fp8_cuda_sm90",
]
