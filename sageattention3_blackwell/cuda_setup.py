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

import setuptools

import build_support as support
from build_support import Extension, build_mode


def setup_args(package: str, plan: Callable[[Callable[[str], str]], list[Extension]], torch_floor: str,
               requirements: list[str]) -> dict:
    """setup()'s ext_modules, cmdclass and install_requires (torch's floor, then `requirements`): the extensions that
    plan(ask_nvcc) returns (ask_nvcc("--version") is nvcc's answer), compiled by torch's BuildExtension. None where
    SAGE_BUILD_CUDA=0, nor where it is unset and torch with CUDA or nvcc is missing (which is printed);
    SAGE_BUILD_CUDA=1 then fails. Against torch >= 2.10 they are stable-ABI abi3 modules (SAGE_STABLE_ABI=0/1
    chooses), which need only torch's headers: SAGE_BUILD_CUDA=1 builds them against a CPU torch too. Neither a GPU
    nor its driver is needed."""
    args = {"install_requires": support.requirements(False, torch_floor, requirements)}
    mode = build_mode(os.environ.get("SAGE_BUILD_CUDA"))
    if mode == "off":
        return args

    def no_cuda(reason: str) -> dict:
        if mode == "on":
            raise RuntimeError(f"SAGE_BUILD_CUDA=1 but the CUDA extensions cannot be built: {reason}")
        print(f"{package}: building without the CUDA extensions, Triton kernels only ({reason})", file=sys.stderr)
        return args

    try:  # torch only now: an isolated build has none, and the pure-Python package needs none
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        return no_cuda("torch is not installed in the build environment (use --no-build-isolation)")
    stable = support.use_stable_abi(torch.__version__, os.environ.get(support.STABLE_ABI_ENV))
    if torch.version.cuda is None:
        if not (stable and mode == "on"):
            return no_cuda(f"torch {torch.__version__} is a CPU build")
        # torch's CPU builds leave CUDA_HOME unset; the stable-ABI build needs nothing of torch's CUDA side.
        found = shutil.which("nvcc")
        cpp_extension.CUDA_HOME = os.environ.get("CUDA_HOME") or (found and os.path.dirname(os.path.dirname(found)))
    cuda_home = cpp_extension.CUDA_HOME
    # shutil.which also finds nvcc.exe, and refuses a CUDA_HOME that only holds the runtime.
    nvcc = cuda_home and shutil.which(os.path.join(cuda_home, "bin", "nvcc"))
    if not nvcc:
        return no_cuda(f"no nvcc found (CUDA_HOME={cuda_home}); install the CUDA toolkit or set CUDA_HOME")

    def ask_nvcc(flag: str) -> str:
        return subprocess.run([nvcc, flag], capture_output=True, text=True, check=True).stdout

    cxx_flags = ["/O2"] if sys.platform == "win32" else ["-O3"]
    extensions = []
    for ext in plan(ask_nvcc):
        macros = [*ext.macros, *(support.stable_abi_macros() if stable else [])]
        print(f"{package}: {ext.name} from {len(ext.sources)} sources, nvcc {' '.join(ext.nvcc_flags)} "
              f"{' '.join(f'-D{name}={value}' for name, value in macros)}", file=sys.stderr)
        # Explicit -gencode flags: torch adds no arch flags of its own. No -std: torch adds the one its headers need.
        flags = {"cxx": cxx_flags, "nvcc": ext.nvcc_flags}
        if not stable:
            extensions.append(cpp_extension.CUDAExtension(ext.name, ext.sources, include_dirs=list(ext.include_dirs),
                                                          define_macros=macros, extra_compile_args=flags))
            continue
        # Links libtorch_cpu (the C shim) and the CUDA runtime only; torch_binding.h finds libtorch_cuda at run time.
        extensions.append(setuptools.Extension(
            ext.name, ext.sources, py_limited_api=True, language="c++", extra_compile_args=flags, define_macros=macros,
            include_dirs=[*ext.include_dirs, *cpp_extension.include_paths(device_type="cuda")],
            library_dirs=cpp_extension.library_paths(device_type="cuda"),
            libraries=["torch_cpu", "cudart"] + ([] if sys.platform == "win32" else ["dl"])))
    args.update(ext_modules=extensions, cmdclass={"build_ext": cpp_extension.BuildExtension})
    if stable:
        args.update(options={"bdist_wheel": {"py_limited_api": support.LIMITED_API}},
                    install_requires=support.requirements(True, torch_floor, requirements))
    return args
