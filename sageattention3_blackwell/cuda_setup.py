"""setup()'s CUDA extension arguments, shared by both packages' setup.py: the one part of their builds that needs
torch, imported by setup.py alone (the build rules, build_support.py and each build_rules.py, stay torch-free).
It lives beside build_support.py, in the one folder both builds see.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Callable

from build_support import Extension, build_mode


def setup_args(package: str, plan: Callable[[Callable[[str], str]], list[Extension]]) -> dict:
    """setup()'s ext_modules and cmdclass: the extensions that plan(ask_nvcc) returns (ask_nvcc("--version") is
    nvcc's answer), compiled by torch's BuildExtension. None where SAGE_BUILD_CUDA=0, nor where it is unset and torch
    with CUDA or nvcc is missing (which is printed); SAGE_BUILD_CUDA=1 then fails. Neither a GPU nor its driver is
    needed."""
    mode = build_mode(os.environ.get("SAGE_BUILD_CUDA"))
    if mode == "off":
        return {}

    def no_cuda(reason: str) -> dict:
        if mode == "on":
            raise RuntimeError(f"SAGE_BUILD_CUDA=1 but the CUDA extensions cannot be built: {reason}")
        print(f"{package}: building without the CUDA extensions, Triton kernels only ({reason})", file=sys.stderr)
        return {}

    try:  # torch only now: an isolated build has none, and the pure-Python package needs none
        import torch
        from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension
    except ImportError:
        return no_cuda("torch is not installed in the build environment (use --no-build-isolation)")
    if torch.version.cuda is None:
        return no_cuda(f"torch {torch.__version__} is a CPU build")
    # shutil.which also finds nvcc.exe, and refuses a CUDA_HOME that only holds the runtime.
    nvcc = CUDA_HOME and shutil.which(os.path.join(CUDA_HOME, "bin", "nvcc"))
    if not nvcc:
        return no_cuda(f"no nvcc found (CUDA_HOME={CUDA_HOME}); install the CUDA toolkit or set CUDA_HOME")

    def ask_nvcc(flag: str) -> str:
        return subprocess.run([nvcc, flag], capture_output=True, text=True, check=True).stdout

    cxx_flags = ["/O2"] if sys.platform == "win32" else ["-O3"]
    extensions = []
    for ext in plan(ask_nvcc):
        macros = " ".join(f"-D{name}={value}" for name, value in ext.macros)
        print(f"{package}: {ext.name} from {len(ext.sources)} sources, nvcc {' '.join(ext.nvcc_flags)} {macros}",
              file=sys.stderr)
        # Explicit -gencode flags: torch adds no arch flags of its own. No -std: torch adds the one its headers need.
        extensions.append(CUDAExtension(ext.name, ext.sources, include_dirs=list(ext.include_dirs),
                                        define_macros=list(ext.macros),
                                        extra_compile_args={"cxx": cxx_flags, "nvcc": ext.nvcc_flags}))
    return {"ext_modules": extensions, "cmdclass": {"build_ext": BuildExtension}}
