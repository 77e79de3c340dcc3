"""What both packages' CUDA build rules share: SAGE_BUILD_CUDA's modes, the TORCH_CUDA_ARCH_LIST parser, nvcc's
answers, loading an arch table by path, and the choice between the stable-ABI and the version-specific build. Torch-free, so CPU tests import it; each package's build_rules.py applies
it to its own arch table (sageattention/archs.py, sageattn3/archs.py) and plans the extensions, which its setup.py
hands to cuda_setup.py (the part that needs torch).

It lives in sageattn3's project root because that is the one folder both builds see: sageattn3's sdist and conda
recipe are built from sageattention3_blackwell/ alone, sageattention's from the repository, which holds this folder.
"""
from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path

_ENTRY = re.compile(r"^(?P<arch>\d+\.\d+)(?P<suffix>[af]?)(?P<ptx>\+PTX)?$")

# The stable-ABI build (csrc/torch_binding.h): libtorch's stable C ABI and CPython's limited API, so one binary
# serves every torch from STABLE_ABI_TORCH on and every CPython from LIMITED_API on (torch's BuildExtension
# defines Py_LIMITED_API as 3.10 from torch 2.9 on). Older torch gets the version-specific build.
STABLE_ABI_TORCH = (2, 10)
LIMITED_API = "cp310"
STABLE_ABI_ENV = "SAGE_STABLE_ABI"


class BuildConfigError(ValueError):
    """TORCH_CUDA_ARCH_LIST, SAGE_BUILD_CUDA or the CUDA toolkit cannot give the build asked for."""


@dataclass(frozen=True)
class Target:
    """One TORCH_CUDA_ARCH_LIST entry: "9.0a+PTX" is Target("9.0", "a", True)."""

    arch: str
    suffix: str = ""
    ptx: bool = False

    @property
    def sm(self) -> str:
        return self.arch.replace(".", "") + self.suffix

    def gencode(self) -> list[str]:
        """SASS for the arch, plus its PTX (which newer GPUs JIT-compile) for "+PTX"."""
        flags = [f"-gencode=arch=compute_{self.sm},code=sm_{self.sm}"]
        if self.ptx:
            flags.append(f"-gencode=arch=compute_{self.sm},code=compute_{self.sm}")
        return flags


@dataclass(frozen=True)
class Extension:
    """One extension module to compile: its name, its sources (relative to the project root), its nvcc flags, the
    macros that every compiler of it (nvcc and the host's) defines, and its include folders."""

    name: str
    sources: list[str]
    nvcc_flags: list[str]
    macros: list[tuple[str, str]] = ()
    include_dirs: list[str] = ()


def load_by_path(path: Path, name: str):
    """A torch-free module of a package (its arch table) without importing the package, which needs torch."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def build_mode(value: str | None) -> str:
    """SAGE_BUILD_CUDA -> "on" (build or fail), "off" (pure Python, no CUDA extension) or "auto" (unset)."""
    modes = {"1": "on", "0": "off", "": "auto"}
    key = (value or "").strip()
    if key not in modes:
        raise BuildConfigError(f"SAGE_BUILD_CUDA={value!r}: use 1 (build the CUDA extensions or fail), "
                               "0 (pure Python, Triton kernels only) or leave it unset (build when torch with CUDA "
                               "and nvcc are present)")
    return modes[key]


def parse_arch_list(text: str, supported, package: str) -> list[Target]:
    """TORCH_CUDA_ARCH_LIST ("8.0;8.6", "9.0a 12.0", "8.9,12.0+PTX") -> targets, in order, without repeats; every
    arch must be one of `supported`."""
    targets = []
    for entry in filter(None, re.split(r"[;\s,]+", text.strip())):
        m = _ENTRY.match(entry)
        if not m or m["arch"] not in supported:
            raise BuildConfigError(f"TORCH_CUDA_ARCH_LIST entry {entry!r} is not supported; {package} builds "
                                   f"for {', '.join(supported)} (each optionally with an 'a' or 'f' suffix or '+PTX')")
        target = Target(m["arch"], m["suffix"], bool(m["ptx"]))
        if target not in targets:
            targets.append(target)
    if not targets:
        raise BuildConfigError(f"TORCH_CUDA_ARCH_LIST {text!r} names no architecture; supported: "
                               f"{', '.join(supported)}")
    return targets


def parse_nvcc_version(output: str) -> tuple[int, int]:
    """`nvcc --version` -> (major, minor)."""
    m = re.search(r"release (\d+)\.(\d+)", output)
    if not m:
        raise BuildConfigError(f"cannot read the CUDA version from nvcc --version:\n{output}")
    return int(m[1]), int(m[2])


def parse_nvcc_archs(output: str) -> set[str]:
    """`nvcc --list-gpu-arch` ("compute_80", "compute_120", ...) -> {"8.0", "12.0", ...}."""
    return {f"{num[:-1]}.{num[-1]}" for num in re.findall(r"compute_(\d+)", output)}


def check_nvcc_archs(targets: list[Target], nvcc: tuple[int, int], nvcc_archs: set[str]) -> None:
    """nvcc must target every arch of the list."""
    missing = [t.arch for t in targets if t.arch not in nvcc_archs]
    if missing:
        listed = sorted(nvcc_archs, key=lambda a: tuple(map(int, a.split("."))))
        raise BuildConfigError(f"nvcc {nvcc[0]}.{nvcc[1]} cannot compile for {', '.join(missing)} (it targets "
                               f"{', '.join(listed)}); use a newer CUDA toolkit or drop these archs from "
                               "TORCH_CUDA_ARCH_LIST")


def default_arch_list(supported, nvcc_archs: set[str]) -> str:
    """Every supported arch that this nvcc can compile for (TORCH_CUDA_ARCH_LIST unset)."""
    return ";".join(a for a in supported if a in nvcc_archs)



def _torch_minor(version: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", version)
    if not m:
        raise BuildConfigError(f"cannot read a torch version from {version!r}")
    return int(m[1]), int(m[2])


def _dotted(version: tuple[int, int]) -> str:
    return ".".join(map(str, version))


def use_stable_abi(torch_version: str, setting: str | None) -> bool:
    """Whether to build against the stable ABI: SAGE_STABLE_ABI=1 or 0 says so; unset, from torch 2.10 on."""
    setting = (setting or "").strip()
    if setting not in ("", "0", "1"):
        raise BuildConfigError(f"{STABLE_ABI_ENV}={setting!r}: use 1 (stable-ABI build) or 0 (version-specific "
                               "build)")
    new_enough = _torch_minor(torch_version) >= STABLE_ABI_TORCH
    if setting == "1" and not new_enough:
        raise BuildConfigError(f"{STABLE_ABI_ENV}=1 needs torch >= {_dotted(STABLE_ABI_TORCH)} to build against; "
                               f"found torch {torch_version}")
    return new_enough if setting == "" else setting == "1"


def stable_abi_macros() -> list[tuple[str, str]]:
    """The binding's stable-ABI switch, and the oldest torch it must load under (TORCH_TARGET_VERSION keeps newer
    stable APIs out of reach: torch/csrc/stable/version.h)."""
    major, minor = STABLE_ABI_TORCH
    return [("SAGE_STABLE_ABI", "1"), ("TORCH_TARGET_VERSION", f"0x{major:02x}{minor:02x}{0:012x}")]


def requirements(stable_abi: bool, torch_floor: str, others: list[str]) -> list[str]:
    """Requires-Dist: the stable-ABI build loads under every torch from STABLE_ABI_TORCH on, the others (and the
    pure-Python package) under the package's own floor."""
    return [f"torch>={_dotted(STABLE_ABI_TORCH) if stable_abi else torch_floor}", *others]
