"""Build of sageattention. Metadata lives in pyproject.toml; this file only adds the compiled CUDA extensions.

SAGE_BUILD_CUDA=1 builds them or fails, =0 gives a pure-Python package (Triton kernels only); unset, they are
built when torch with CUDA and nvcc are present (pip install --no-build-isolation .), else the reason is printed.
TORCH_CUDA_ARCH_LIST picks the archs (default: every supported arch nvcc can target), MAX_JOBS the parallel
compile jobs, SAGE_BUILD_FAMILIES (e.g. "sm90") only some of the modules. Neither a GPU nor its driver is needed.
The rules are in build_rules.py; docs/building.md.
"""
import os
import shutil
import subprocess
import sys

from setuptools import setup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import build_rules  # noqa: E402


def _no_cuda(reason: str, forced: bool) -> dict:
    if forced:
        raise RuntimeError(f"SAGE_BUILD_CUDA=1 but the CUDA extensions cannot be built: {reason}")
    print(f"sageattention: building without the CUDA extensions, Triton kernels only ({reason})", file=sys.stderr)
    return {}


def cuda_build_args() -> dict:
    mode = build_rules.build_mode(os.environ.get("SAGE_BUILD_CUDA"))
    if mode == "off":
        return {}
    forced = mode == "on"
    try:  # torch only now: an isolated build has none, and the pure-Python package needs none
        import torch
        from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension
    except ImportError:
        return _no_cuda("torch is not installed in the build environment (use --no-build-isolation)", forced)
    if torch.version.cuda is None:
        return _no_cuda(f"torch {torch.__version__} is a CPU build", forced)
    # shutil.which also finds nvcc.exe, and refuses a CUDA_HOME that only holds the runtime.
    nvcc = CUDA_HOME and shutil.which(os.path.join(CUDA_HOME, "bin", "nvcc"))
    if not nvcc:
        return _no_cuda(f"no nvcc found (CUDA_HOME={CUDA_HOME}); install the CUDA toolkit or set CUDA_HOME", forced)

    def ask_nvcc(flag: str) -> str:
        return subprocess.run([nvcc, flag], capture_output=True, text=True, check=True).stdout

    plan = build_rules.plan(os.environ.get("TORCH_CUDA_ARCH_LIST"), ask_nvcc("--version"), ask_nvcc("--list-gpu-arch"),
                            families=os.environ.get("SAGE_BUILD_FAMILIES"))
    cxx_flags = ["/O2"] if sys.platform == "win32" else ["-O3"]
    extensions = []
    for ext in plan:
        macros = " ".join(f"-D{name}={value}" for name, value in ext.macros)
        print(f"sageattention: {ext.name} from {len(ext.sources)} sources, nvcc {' '.join(ext.nvcc_flags)} {macros}",
              file=sys.stderr)
        # Explicit -gencode flags: torch adds no arch flags of its own. No -std: torch adds the one its headers need.
        extensions.append(CUDAExtension(ext.name, ext.sources, include_dirs=[str(build_rules.ROOT / build_rules.CSRC)],
                                        define_macros=ext.macros,
                                        extra_compile_args={"cxx": cxx_flags, "nvcc": ext.nvcc_flags}))
    return {"ext_modules": extensions, "cmdclass": {"build_ext": BuildExtension}}


setup(**cuda_build_args())
