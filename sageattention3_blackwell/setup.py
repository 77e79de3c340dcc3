"""Build of sageattn3. Metadata lives in pyproject.toml; this file adds the CUDA extension and the run
requirements, whose torch floor depends on the extension's build (build_rules.requirements).

The extension is built when torch with CUDA and nvcc are present (pip install --no-build-isolation).
SAGE_BUILD_CUDA=1 requires it (fails loudly otherwise), SAGE_BUILD_CUDA=0 skips it. Against torch >= 2.10
it is the stable-ABI build (sageattn3/_C.abi3.so, for every torch >= 2.10 and CPython >= 3.10; it needs only
torch's headers, so SAGE_BUILD_CUDA=1 builds it against a CPU torch too), else the version-specific build;
SAGE_STABLE_ABI=0/1 chooses. Targets come from TORCH_CUDA_ARCH_LIST (default "10.0;12.0"); MAX_JOBS limits
parallel compile jobs. Neither a GPU nor the network is needed.
"""
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import build_rules  # noqa: E402


def _no_cuda(reason: str, forced: bool):
    if forced:
        raise RuntimeError(f"SAGE_BUILD_CUDA=1 but the CUDA extension cannot be built: {reason}")
    print(f"sageattn3: building without the CUDA extension ({reason})", file=sys.stderr)
    return {}


def cuda_build_args() -> dict:
    mode = os.environ.get("SAGE_BUILD_CUDA", "").strip()
    if mode == "0":
        return {}
    forced = mode == "1"
    try:  # torch only now: an isolated build has none, and needs none for the pure-Python package
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        return _no_cuda("torch is not installed in the build environment (use --no-build-isolation)", forced)
    stable = build_rules.use_stable_abi(torch.__version__, os.environ.get(build_rules.STABLE_ABI_ENV))
    if torch.version.cuda is None:
        if not (stable and forced):
            return _no_cuda(f"torch {torch.__version__} is a CPU build", forced)
        # torch's CPU builds leave CUDA_HOME unset; the stable-ABI build needs nothing of torch's CUDA side.
        nvcc = shutil.which("nvcc")
        cpp_extension.CUDA_HOME = os.environ.get("CUDA_HOME") or (nvcc and os.path.dirname(os.path.dirname(nvcc)))
    if cpp_extension.CUDA_HOME is None:
        return _no_cuda("no CUDA toolkit (nvcc) found; set CUDA_HOME", forced)
    nvcc = os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc")
    version_text = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    build_rules.check_cuda_version(build_rules.parse_nvcc_version(version_text))
    # Explicit -gencode flags also stop torch from adding its own (non-"a") targets. No -std flag: torch adds
    # the standard its own headers need (C++17 in older releases, C++20 in newer ones, whose headers
    # no longer build as C++17 everywhere) only when none is given.
    nvcc_flags = ["-O3", *build_rules.gencode_flags(os.environ.get("TORCH_CUDA_ARCH_LIST"))]
    cxx_flags = ["/O2"] if sys.platform == "win32" else ["-O3"]
    flags = {"cxx": cxx_flags, "nvcc": nvcc_flags}
    if not stable:
        extension = cpp_extension.CUDAExtension("sageattn3._C", build_rules.SOURCES, extra_compile_args=flags)
        return {"ext_modules": [extension], "cmdclass": {"build_ext": cpp_extension.BuildExtension}}
    # Links libtorch_cpu (the C shim) and the CUDA runtime only; torch_binding.h finds libtorch_cuda at run time.
    extension = Extension(
        "sageattn3._C", build_rules.SOURCES, py_limited_api=True, language="c++", extra_compile_args=flags,
        define_macros=build_rules.stable_abi_macros(), include_dirs=cpp_extension.include_paths(device_type="cuda"),
        library_dirs=cpp_extension.library_paths(device_type="cuda"),
        libraries=["torch_cpu", "cudart"] + ([] if sys.platform == "win32" else ["dl"]))
    return {"ext_modules": [extension], "cmdclass": {"build_ext": cpp_extension.BuildExtension},
            "options": {"bdist_wheel": {"py_limited_api": build_rules.LIMITED_API}},
            "install_requires": build_rules.requirements(stable_abi=True)}


# The stable-ABI build says its own torch floor; the others (and the pure-Python package) have the older one.
setup(**{"install_requires": build_rules.requirements(stable_abi=False), **cuda_build_args()})
