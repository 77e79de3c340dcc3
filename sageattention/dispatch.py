"""Which kernels serve which GPU.

The Triton kernels serve every supported architecture. The compiled CUDA kernels (modules
`sageattention._C_<family>`, built from csrc/ for the archs of TORCH_CUDA_ARCH_LIST; archs.py says which family
serves which arch) serve the
`_cuda` variants wherever the build holds them, and `sageattn` except where archs.py prefers Triton;
elsewhere the same algorithm runs on Triton.
"""
from __future__ import annotations

import functools
import importlib

import torch

from . import archs
from .archs import supported_capabilities
from .inputs import interpreting

SUPPORTED = supported_capabilities()  # archs.py's table: what the build targets and the kernels serve
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


class CompiledModule:
    """What sageattention._C_<family> serves: the CUDA kernels of its operators, torch.ops.sageattention_<family>
    (registered when the module loads; their schemas and fakes are ops.py's), and its torch-free functions."""

    def __init__(self, family: str, module):
        from . import ops  # noqa: F401  (the schemas; ops imports this module)

        operators = getattr(torch.ops, f"sageattention_{family}")
        self.attention = operators.attention.default  # (q, k, v, *CompiledCall.kernel_args()) -> (out, lse)
        self._quantize = operators.quantize.default
        self.runs_on_current_device = module.runs_on_current_device
        self.FP8_F16_ACCUM = module.fp8_f16_accum()  # built with the f16-accumulating FP8 MMA

    def quantize(self, *args) -> list:
        """The preparation's intermediates, for tests; None for those its V mode leaves out (empty tensors)."""
        return [part if part.numel() else None for part in self._quantize(*args)]


@functools.cache
def compiled_module(family: str) -> CompiledModule | None:
    """sageattention._C_<family> (built from csrc/ by setup.py), or None when this build lacks it."""
    try:
        module = importlib.import_module(f"{__package__}._C_{family}")
    except ImportError:
        return None
    return CompiledModule(family, module)


@functools.cache
def _compiled_runs_on(family: str, index: int) -> bool:
    module = compiled_module(family)
    if module is None:
        return False
    with torch.cuda.device(index):
        return module.runs_on_current_device()


_PV16_FAMILY = next(f for f, info in archs.FAMILIES.items() if info["pv"] == "fp16")


def family_for(cap, pv_fp8: bool) -> str | None:
    """The compiled family that computes this P·V precision on capability `cap`, from archs.py: FP8 P·V is the
    arch's own family where that family's P·V is FP8; 16-bit P·V is the sm80 family on every arch it runs on."""
    if pv_fp8:
        family = archs.ARCH_FAMILY.get(f"{cap[0]}.{cap[1]}")
        return family if family is not None and archs.FAMILIES[family]["pv"] == "fp8" else None
    return _PV16_FAMILY if cap >= archs.version_tuple(archs.FAMILIES[_PV16_FAMILY]["min_arch"]) else None


def compiled_family(cap, pv_fp8: bool, device: torch.device) -> str | None:
    """`family_for(cap, pv_fp8)` when this build holds its module with device code for the GPU; else None."""
    family = None if cap is None else family_for(cap, pv_fp8)
    if family is None:
        return None
    index = torch.cuda.current_device() if device.index is None else device.index
    return family if _compiled_runs_on(family, index) else None


# torch.compile takes compiled_family's answer as a constant: tracing cannot import a module or ask the device. This
# is the mark torch.compiler.assume_constant_result sets; calling it here would import torch._dynamo (~2 s) with us.
compiled_family._dynamo_marked_constant = True


def sageattn_prefers_compiled(cap) -> bool:
    """Whether `sageattn` runs the compiled kernels on this GPU when they are built for it (archs.py says why not)."""
    return f"{cap[0]}.{cap[1]}" not in archs.SAGEATTN_PREFERS_TRITON
