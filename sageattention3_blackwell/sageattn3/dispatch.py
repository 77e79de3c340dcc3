"""Which implementation runs: the compiled CUDA kernels, Triton (native FP4 MMA or decoded operands), or the
PyTorch reference.

backend="auto" on a CUDA tensor (docs/sageattn3.md has the same table):
1. sm_100/sm_120/sm_121 with the compiled extension sageattn3._C: the CUDA kernels, once they pass a self-check
   on this GPU (a small problem against the PyTorch reference, run once per process and GPU). A failed check
   warns, naming the reason, and the Triton step decides.
2. Triton, where the installed Triton compiles sageattn3's kernel for this GPU (TRITON_NATIVE, TRITON_DECODED):
   `tl.dot_scaled` on the FP4 tensor cores, or else the same products from decoded operands (slower).
3. Otherwise a RuntimeError that names what to install.
Other GPUs raise "Unsupported GPU" unless emulation is allowed (testing only): then Triton, decoded.
"""
import functools
import os
import warnings

import torch

from .archs import ARCH_KERNEL

BACKENDS = ("auto", "cuda", "triton", "reference")
EMULATION_ENV = "SAGEATTN3_ALLOW_EMULATION"
# The Blackwell GPUs with FP4 tensor cores: those of the compiled kernels (archs.py).
SUPPORTED_CAPABILITIES = tuple(tuple(int(n) for n in arch.split(".")) for arch in ARCH_KERNEL)

# What each Triton release compiles, found by compiling sageattn3's kernel for each arch with Triton 3.3.1,
# 3.4.0, 3.5.1, 3.6.0 and 3.7.1 (no GPU needed; tests/test_sage3_backend_table.py re-checks the installed one).
# A newer Triton counts as the newest one checked; an older one as unable.
TRITON_CHECKED = ((3, 3), (3, 4), (3, 5), (3, 6), (3, 7))
# NVFP4 `tl.dot_scaled` on the FP4 tensor cores: 3.4 fails on sm_100 where 3.3 and 3.5 compile; sm_120's
# native lowering came with 3.6; sm_121 has none up to 3.7.
TRITON_NATIVE = {(10, 0): {(3, 3), (3, 5), (3, 6), (3, 7)}, (12, 0): {(3, 6), (3, 7)}}
# The decoded-operand kernel (fp16 MMA) compiles from 3.3 on, except for sm_121, which Triton < 3.6 cannot target.
TRITON_DECODED = {(12, 1): (3, 6)}


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def triton_mode(capability: tuple[int, int], version: str | None) -> str | None:
    """'native', 'decoded', or None when Triton `version` (None: not installed) cannot compile the kernel."""
    if version is None or _minor(version) < TRITON_CHECKED[0]:
        return None
    v = min(_minor(version), TRITON_CHECKED[-1])
    if v in TRITON_NATIVE.get(capability, ()):
        return "native"
    return "decoded" if v >= TRITON_DECODED.get(capability, TRITON_CHECKED[0]) else None


def installed_triton() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def _load_extension():
    try:
        from . import _C
    except ImportError:
        return None
    return _C


def emulation_allowed(allow_emulation: bool) -> bool:
    return allow_emulation or os.environ.get(EMULATION_ENV, "") == "1"


def _arch(capability: tuple[int, int]) -> str:
    return f"sm_{capability[0]}{capability[1]}"


def _close(got: torch.Tensor, lse: torch.Tensor, want: torch.Tensor, want_lse: torch.Tensor) -> str | None:
    """Why the kernels' result is not the reference's (the GPU tests' bounds), or None."""
    if not (got.isfinite().all() and lse.isfinite().all()):
        return "non-finite output"
    a, b = got.double().flatten(), want.double().flatten()
    cosine = torch.nn.functional.cosine_similarity(a, b, dim=0).item()
    rel_l1 = ((a - b).abs().sum() / b.abs().sum()).item()
    lse_err = (lse - want_lse).abs().max().item()
    if cosine < 0.999 or rel_l1 > 0.02 or lse_err > 1e-3:
        return f"cosine {cosine:.5f} (>= 0.999), relative L1 {rel_l1:.4f} (<= 0.02), LSE error {lse_err:.1e} (<= 1e-3)"
    return None


@functools.cache
def self_check_failure(device: torch.device) -> str | None:
    """Run the compiled kernels once on a small causal problem on `device` and compare with the reference.

    Returns None when they agree, else the reason (also raised as a RuntimeWarning). Cached per device."""
    from .cuda_attn import attention_cuda
    from .prepare import quantize_inputs
    from .reference import attention_reference

    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(1, 2, 200, 128, generator=g, device=device, dtype=torch.float16) for _ in range(3))
    scale = 128 ** -0.5
    try:
        qi = quantize_inputs(q, k, v)
        reason = _close(*attention_cuda(qi, True, scale), *attention_reference(qi, True, scale))
    except Exception as exc:  # noqa: BLE001 - e.g. no kernel image for this GPU: the check failed, say why
        reason = f"{type(exc).__name__}: {exc}"
    if reason:
        warnings.warn(f"sageattn3: the compiled CUDA kernels failed their self-check on {device} ({reason}); "
                      "using the Triton kernel instead. Please report this with your GPU and driver; "
                      "backend='cuda' still forces the compiled kernels.", RuntimeWarning, stacklevel=2)
    return reason


@functools.cache
def _note_decoded(capability: tuple[int, int], version: str) -> None:
    warnings.warn(f"sageattn3: Triton {version} cannot use the FP4 tensor cores of {_arch(capability)}, so the "
                  "Triton kernel decodes its FP4 operands (same results, slower). A newer Triton does "
                  "(sm_100: 3.3 or >= 3.5; sm_120: >= 3.6, which comes with torch >= 2.10).",
                  RuntimeWarning, stacklevel=3)


def _no_kernel(device: torch.device, capability: tuple[int, int], version: str | None, why_not_cuda: str) -> str:
    floor = TRITON_DECODED.get(capability, TRITON_CHECKED[0])
    triton = f"Triton {version} cannot compile" if version else "Triton is not installed for"
    return (f"sageattn3 has no kernel for {torch.cuda.get_device_name(device)} ({_arch(capability)}) here: "
            f"{why_not_cuda}, and {triton} its Triton kernel on {_arch(capability)}. Install Triton >= "
            f"{floor[0]}.{floor[1]} (pip install 'triton>={floor[0]}.{floor[1]}', or triton-windows on Windows), "
            "or pass backend='reference' for the (slow) PyTorch reference.")


def choose_backend(device: torch.device, backend: str, allow_emulation: bool) -> str:
    """The backend that runs for tensors on `device` (see the module docstring); errors name what to do."""
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
    blackwell = capability in SUPPORTED_CAPABILITIES
    if not blackwell and not emulation_allowed(allow_emulation):
        raise RuntimeError(
            f"Unsupported GPU: {torch.cuda.get_device_name(device)} ({_arch(capability)}). sageattn3 needs FP4 "
            "tensor cores (sm_100, sm_120 or sm_121 Blackwell); on this GPU use sageattention.sageattn (pip install "
            f"sageattention). To run the emulated Triton path here anyway (testing only, slow), pass "
            f"allow_emulation=True or set {EMULATION_ENV}=1.")
    has_extension = _load_extension() is not None
    if backend == "cuda":
        if not blackwell:
            raise RuntimeError(f"backend='cuda' needs sm_100/sm_120/sm_121; this GPU is {_arch(capability)}")
        if not has_extension:
            raise RuntimeError("backend='cuda' needs the compiled extension sageattn3._C, which this install lacks "
                               "(build with SAGE_BUILD_CUDA=1, see the README)")
        return backend
    if backend == "auto" and blackwell and has_extension:
        index = device.index if device.index is not None else torch.cuda.current_device()
        if self_check_failure(torch.device("cuda", index)) is None:
            return "cuda"
        why_not_cuda = "the compiled kernels failed their self-check (see the warning)"
    elif backend == "triton":
        why_not_cuda = "backend='triton' was asked for"
    else:
        why_not_cuda = ("this install has no compiled kernels (sageattn3._C)" if blackwell
                        else "the compiled kernels need sm_100/sm_120/sm_121")
    version = installed_triton()
    mode = triton_mode(capability, version)
    if mode is None:
        raise RuntimeError(_no_kernel(device, capability, version, why_not_cuda))
    if mode == "decoded" and blackwell:
        _note_decoded(capability, version)
    return "triton"


def triton_native(device: torch.device) -> bool:
    """Whether the Triton kernel uses `tl.dot_scaled` on `device` (CPU: the interpreter, which emulates it)."""
    if device.type != "cuda":
        return True
    return triton_mode(torch.cuda.get_device_capability(device), installed_triton()) == "native"
