"""Which tokens share one INT8 scale: the quantization granularities of Q and K.

A granularity is described by a period of tokens (`block`) split as a 4-D shape
`(G1, R1, G2, R2)` in row-major order: tokens that differ only in their R1/R2 coordinates
share a scale, so one period holds `G1 * G2` scales. This one description drives the Triton
quantization kernel (reshape + reduce), the attention kernel (scale gather) and the
PyTorch reference, so the three agree by construction.

The thread granularity follows the fragment layout of the INT8 tensor-core MMA
(m16n8k32): a warp owns 32 query rows; lane group g (lane // 4) holds rows g, g+8, g+16,
g+24 of them, so those 4 rows share a Q scale (8 scales per 32 rows). In the score tile a
lane holds key columns 2t, 2t+1 (t = lane % 4) of every 8-column slice, so within 64 keys
the 16 columns of one t share a K scale (4 scales per 64 keys). Per-block K periods are 128 keys,
the longest key tile of the attention kernel, so such a tile has a single K scale.
"""
from __future__ import annotations

from dataclasses import dataclass

GRANULARITIES = ("per_block", "per_warp", "per_thread")

Q_BLOCK = 128  # query tokens per quantization period
K_BLOCK = 128  # key tokens per per-block quantization period
# fp32's least normal: every quantization scale's floor, whose reciprocal (2**126) must stay finite; a smaller scale
# (all |x| of a group below 127 * 2**-126, or 448 * 2**-126 for FP8 V: bf16 only) would make x * (1 / scale) inf.
# csrc/common/quant.cuh kMinScale is the same number.
MIN_SCALE = 2.0**-126


@dataclass(frozen=True)
class Grouping:
    g1: int
    r1: int
    g2: int
    r2: int

    @property
    def block(self) -> int:
        return self.g1 * self.r1 * self.g2 * self.r2

    @property
    def groups_per_block(self) -> int:
        return self.g1 * self.g2


_Q = {
    "per_block": Grouping(1, Q_BLOCK, 1, 1),
    "per_warp": Grouping(Q_BLOCK // 32, 32, 1, 1),
    "per_thread": Grouping(Q_BLOCK // 32, 4, 8, 1),
}
_K = {
    "per_block": Grouping(1, K_BLOCK, 1, 1),
    "per_warp": Grouping(1, K_BLOCK, 1, 1),
    "per_thread": Grouping(1, 64 // 8, 4, 2),
}


# The compiled kernels (csrc/): a warp owns 16 query rows (one m16 MMA tile), so per_warp Q groups are 16 rows and
# per_thread Q groups pair rows g and g + 8 of each 16; key tiles are 64 keys, so per_block K groups are 64 keys.
# The per_thread K groups are the same as above.
_Q_COMPILED = {
    "per_block": Grouping(1, Q_BLOCK, 1, 1),
    "per_warp": Grouping(Q_BLOCK // 16, 16, 1, 1),
    "per_thread": Grouping(Q_BLOCK // 16, 2, 8, 1),
}
_K_COMPILED = {
    "per_block": Grouping(1, 64, 1, 1),
    "per_warp": Grouping(1, 64, 1, 1),
    "per_thread": _K["per_thread"],
}


def check_granularity(name: str) -> str:
    if name not in GRANULARITIES:
        raise ValueError(f"qk_quant_gran={name!r} is not supported; use one of {GRANULARITIES}")
    return name


def q_grouping(name: str, compiled: bool = False) -> Grouping:
    """compiled: the groups of the CUDA kernels in csrc/, else those of the Triton kernels."""
    return (_Q_COMPILED if compiled else _Q)[check_granularity(name)]


def k_grouping(name: str, compiled: bool = False) -> Grouping:
    return (_K_COMPILED if compiled else _K)[check_granularity(name)]
