"""Which implementation runs: CUDA extension, Triton, or the PyTorch reference."""
import os

import torch

BACKENDS = ("auto", "cuda", "triton", "reference")
EMULATION_ENV = "SAGEATTN3_ALLOW_EMULATION"
SUPPORTED_CAPABILITIES = ((10, 0), (12, 0), (12, 1))
NVFP4_TRITON = (3, 6)  # first Triton whose tl.dot_scaled lowers NVFP4 (e4m3 scales per 16) for sm_100 and sm_120


def require_nvfp4_triton(version: str) -> None:
    """The Triton path needs NVFP4 dot_scaled; older Triton (as pinned by torch 2.7/2.8) gets a clear error."""
    major, minor = (int(x) for x in version.split(".")[:2])
    if (major, minor) < NVFP4_TRITON:
        raise RuntimeError(
            f"sageattn3's Triton kernel needs Triton >= {NVFP4_TRITON[0]}.{NVFP4_TRITON[1]} (NVFP4 tl.dot_scaled); "
            f"Triton {version} is installed. Use backend='cuda' (the compiled kernels) or upgrade Triton.")


def _load_extension():
    try:
        from . import _C
    except ImportError:
        return None
    return _C


def emulation_allowed(allow_emulation: bool) -> bool:
    return allow_emulation or os.environ.get(EMULATION_ENV, "") == "1"


def choose_backend(device: torch.device, backend: str, allow_emulation: bool) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "reference":
        return backend
    if device.type != "cuda":
        if backend == "triton" and os.environ.get("TRITON_INTERPRET") == "1":
            return backend
        raise ValueError(f"sageattn3 kernels need CUDA tensors, got tensors on {device}; "
                         "backend='reference' runs the PyTorch reference anywhere, and backend='triton' "
                         "runs on CPU under TRITON_INTERPRET=1")
    capability = torch.cuda.get_device_capability(device)
    if capability not in SUPPORTED_CAPABILITIES and not emulation_allowed(allow_emulation):
        name = torch.cuda.get_device_name(device)
        raise RuntimeError(
            f"Unsupported GPU: {name} (sm_{capability[0]}{capability[1]}). sageattn3 needs FP4 tensor cores "
            "(sm_100, sm_120 or sm_121 Blackwell); on this GPU use sageattention.sageattn (pip install "
            f"sageattention). To run the emulated Triton path here anyway (testing only, slow), pass "
            f"allow_emulation=True or set {EMULATION_ENV}=1.")
    if backend == "cuda":
        if capability not in SUPPORTED_CAPABILITIES:
            raise RuntimeError(f"backend='cuda' needs sm_100/sm_120/sm_121; this GPU is sm_{capability[0]}{capability[1]}")
        if _load_extension() is None:
            raise RuntimeError("backend='cuda' needs the compiled extension sageattn3._C, which this install lacks "
                               "(build with SAGE_BUILD_CUDA=1, see the README)")
        return backend
    # "auto" picks Triton: its kernel logic is verified by the emulated runs; the CUDA kernels are
    # compile-verified only until they have run on Blackwell hardware (see README).
    import triton

    require_nvfp4_triton(triton.__version__)
    return "triton"
