"""Which kernels serve which GPU.

The Triton kernels serve every supported architecture. Compiled CUDA kernels (the optional
extension `sageattention._C`, built from csrc/) take over for the architectures they were
built for once they exist; until then the `_cuda` variants run the same algorithm on Triton.
"""
from __future__ import annotations

import functools

import torch

from .inputs import interpreting

# Compute capabilities the Triton kernels are built and tuned for (INT8 tensor cores: sm80+).
SUPPORTED = {(8, 0), (8, 6), (8, 7), (8, 9), (9, 0), (10, 0), (10, 3), (12, 0), (12, 1)}
FP8_MIN = (8, 9)  # FP8 tensor cores: Ada and newer
TMA_MIN = (9, 0)  # the tensor memory accelerator: Hopper and newer


def _names(caps) -> str:
    return ", ".join(f"sm{a}{b}" for a, b in sorted(caps))


def capability(device: torch.device):
    """(major, minor) of a CUDA device; None under Triton's CPU interpreter."""
    if device.type != "cuda" and interpreting():
        return None
    return _cuda_capability(torch.cuda.current_device() if device.index is None else device.index)


@functools.cache
def _cuda_capability(index: int):
    # Every call asks several times (P·V default, support check, TMA); a device's answer never changes.
    return torch.cuda.get_device_capability(index)


def check_supported(device: torch.device, needs_fp8: bool = False, only=None):
    """Raise a clear error if the GPU cannot run the requested kernels; returns its capability."""
    cap = capability(device)
    if cap is None:
        return None
    allowed = SUPPORTED if only is None else set(only)
    if needs_fp8:
        allowed = {c for c in allowed if c >= FP8_MIN}
    if cap not in allowed:
        name = torch.cuda.get_device_name(device)
        raise RuntimeError(
            f"GPU {name} (sm{cap[0]}{cap[1]}) is not supported by this sageattention kernel; "
            f"supported: {_names(allowed)}"
        )
    return cap


def default_pv_fp8(cap) -> bool:
    """sageattn's choice for P·V: FP8 where FP8 tensor cores exist (twice the FP16 rate), else 16-bit."""
    return cap is None or cap >= FP8_MIN


@functools.cache
def cuda_extension_archs() -> frozenset:
    """Architectures the compiled extension was built for (empty until csrc/ kernels exist)."""
    try:
        from . import _C  # noqa: F401  (built by setup.py from csrc/)
    except ImportError:
        return frozenset()
    return frozenset(getattr(_C, "ARCHS", ()))
