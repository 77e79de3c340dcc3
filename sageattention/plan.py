"""What a call computes and the quantized operands: the types every kernel backend (Triton, CUDA) shares."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Plan:
    """What the kernels compute; resolved from the public arguments by `sageattention.core`."""

    qk_quant_gran: str = "per_thread"
    pv_fp8: bool = False
    pv_two_level: bool = False  # P·V of each key block in its own accumulator, then added in fp32
    pv_inner_fp16: bool = False  # that per-block accumulator is fp16
    smooth_k: bool = True
    smooth_v: bool = False

    def fields(self) -> tuple:
        """The plan as the custom op's arguments (dataclasses.astuple deep-copies: ~6 µs per call)."""
        return (self.qk_quant_gran, self.pv_fp8, self.pv_two_level, self.pv_inner_fp16, self.smooth_k, self.smooth_v)


@dataclass
class Quantized:
    """The quantized operands of one call, HND views ([B, H, N, D])."""

    q_i8: torch.Tensor
    q_scale: torch.Tensor
    k_i8: torch.Tensor
    k_scale: torch.Tensor
    v: torch.Tensor  # 16-bit V (HND view) or FP8 V^T
    v_scale: torch.Tensor | None
    v_mean: torch.Tensor | None
    k_mean: torch.Tensor | None  # [B, HK, S, D] fp32, kept for the LSE correction
