"""NVFP4 microscaling in PyTorch: FP4 e2m1 values with one FP8 e4m3 scale per 16 elements.

Codes are packed two per byte, the element with the lower index in the low nibble (the order
that `tl.dot_scaled` and the PTX e2m1x2 conversions use).
"""
import functools

import torch

GROUP = 16  # elements sharing one e4m3 scale
E2M1_MAX = 6.0
E4M3_MAX = 448.0
MAX_VALUE = E2M1_MAX * E4M3_MAX  # 2688: the largest magnitude a code times a group scale holds

# The 8 non-negative e2m1 magnitudes, indexed by the 3-bit code (sign is bit 3).
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

# Round-to-nearest-even onto the e2m1 grid: a magnitude moves past each midpoint in turn.
# At an exact midpoint it goes to the even code, so "> t" where the lower code is even and
# ">= t" where the upper code is even.
_STRICT_MIDPOINTS = (0.25, 1.25, 2.5, 5.0)
_INCLUSIVE_MIDPOINTS = (0.75, 1.75, 3.5)


def encode_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round float32 values (already divided by their scale) to e2m1 codes (uint8, 0..15), saturating at 6."""
    a = x.abs()
    code = torch.zeros_like(a, dtype=torch.uint8)
    for t in _STRICT_MIDPOINTS:
        code += (a > t).to(torch.uint8)
    for t in _INCLUSIVE_MIDPOINTS:
        code += (a >= t).to(torch.uint8)
    return code | ((x < 0) & (code > 0)).to(torch.uint8) << 3


def decode_e2m1(code: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (uint8, 0..15) to float32."""
    mag = _magnitudes(code.device)[(code & 7).long()]
    return torch.where((code & 8) > 0, -mag, mag)


@functools.cache
def _magnitudes(device: torch.device) -> torch.Tensor:
    return torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=device)


def pack_nibbles(code: torch.Tensor) -> torch.Tensor:
    """[..., 2n] codes -> [..., n] bytes, even index in the low nibble."""
    pairs = code.reshape(*code.shape[:-1], -1, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """[..., n] bytes -> [..., 2n] codes."""
    return torch.stack((packed & 15, packed >> 4), dim=-1).reshape(*packed.shape[:-1], -1)


def _groups(x: torch.Tensor) -> torch.Tensor:
    """[..., n] -> [..., n/16, 16] view."""
    return x.reshape(*x.shape[:-1], -1, GROUP)


def group_scales(x: torch.Tensor) -> torch.Tensor:
    """One e4m3 scale per 16 elements of the last dim: amax / 6, rounded to nearest even, clamped to 448."""
    amax = _groups(x.float()).abs().amax(dim=-1)
    return (amax / E2M1_MAX).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)


def encode(x: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Packed codes (uint8 [..., n/2]) of x [..., n] divided by its group scales [..., n/16] (any float dtype)."""
    s = scales.float()[..., None]
    # A zero scale means the whole group rounds to zero; avoid 0/0.
    scaled = torch.where(s > 0, _groups(x.float()) / torch.where(s > 0, s, 1.0), 0.0)
    return pack_nibbles(encode_e2m1(scaled).flatten(-2))


def quantize(x: torch.Tensor):
    """Quantize along the last dim (a multiple of 16). Returns (packed codes uint8 [..., n/2], scales e4m3 [..., n/16])."""
    if x.shape[-1] % GROUP:
        raise ValueError(f"the quantized dim must be a multiple of {GROUP}, got {x.shape[-1]}")
    scales = group_scales(x)
    return encode(x, scales), scales


def dequantize(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Inverse of `encode`/`quantize` (up to rounding): float32 [..., n]."""
    values = _groups(decode_e2m1(unpack_nibbles(packed)))
    return (values * scales.float()[..., None]).flatten(-2)
