"""Build rules of sageattention's compiled CUDA extensions, torch-free so CPU tests import them (setup.py applies them).

One extension module per kernel family of sageattention/archs.py, `sageattention._C_<family>`, made from every
csrc/<family>/*.cu and *.cpp and compiled only for the archs of TORCH_CUDA_ARCH_LIST whose instructions it uses,
so that mixed lists such as "8.0;8.6;9.0;12.0" build. docs/building.md describes the options.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
CSRC = "csrc"
# torch_binding.h, the binding's two torch APIs (stable ABI or ATen), in the folder of sageattn3's that both builds see.
BINDING_INCLUDE = "sageattention3_blackwell/csrc"

# What both packages' builds share (its docstring says why it lives in sageattn3's folder).
sys.path.insert(0, str(ROOT / "sageattention3_blackwell"))
try:
    import build_support as support
finally:
    sys.path.pop(0)
from build_support import (BuildConfigError, Extension, Target, build_mode, parse_nvcc_archs,  # noqa: E402,F401
                           parse_nvcc_version)

# By path: importing the package would import torch, which an isolated build lacks.
archs = support.load_by_path(ROOT / "sageattention" / "archs.py", "_sageattention_archs")

# The version-specific build's torch floor (the stable-ABI build's is build_support.STABLE_ABI_TORCH), and the run
# requirements besides torch (pyproject.toml leaves them to setup.py: the torch floor depends on the build).
TORCH_FLOOR = "2.6"
REQUIREMENTS = ["triton>=3.2; sys_platform == 'linux'", "triton-windows>=3.2; sys_platform == 'win32'"]

# No --use_fast_math: the quantizers need IEEE division. The -U flags undo the half/bfloat16 restrictions torch
# adds to every .cu file, so that the kernels compile here exactly as plain nvcc compiles them (csrc is torch-free).
NVCC_FLAGS = ["-O3", "-lineinfo", "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
              "-U__CUDA_NO_HALF2_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__"]
# The f16-accumulating e4m3 MMA is compiled only under this macro (nvcc >= archs.FP8_F16_ACCUM_MIN_CUDA). A macro,
# not an nvcc flag: the binding (compiled by the host compiler) must see it too, or it maps the mode away.
FP8_F16_ACCUM_MACRO = ("SAGE_FP8_F16_ACCUM", "1")


def parse_arch_list(text: str) -> list[Target]:
    """TORCH_CUDA_ARCH_LIST ("8.0;8.6", "9.0a 12.0", "8.9,12.0+PTX") -> targets, in order, without repeats."""
    return support.parse_arch_list(text, archs.ARCH_FAMILY, "sageattention")


def default_arch_list(nvcc_archs: set[str]) -> str:
    """Every supported arch that this nvcc can compile for."""
    return support.default_arch_list(archs.ARCH_FAMILY, nvcc_archs)


def _version(t: tuple[int, int]) -> str:
    return f"{t[0]}.{t[1]}"


def family_targets(targets: list[Target], family: str) -> list[Target]:
    """The targets a family is compiled for: those at or above the oldest arch that has its instructions, or, for
    a family of arch-specific features ("only"), those archs alone, with the family's suffix and no PTX (sm_90a
    code runs on sm_90 only, so PTX of it would serve no newer GPU)."""
    info = archs.FAMILIES[family]
    if "only" in info:
        chosen = [Target(t.arch, info["suffix"]) for t in targets if t.arch in info["only"]]
        return list(dict.fromkeys(chosen))
    floor = archs.version_tuple(info["min_arch"])
    return [t for t in targets if archs.version_tuple(t.arch) >= floor]


def families_for(targets: list[Target]) -> list[str]:
    """The families (extension modules) that have an arch among the targets, in archs.py's order."""
    return [family for family in archs.FAMILIES if family_targets(targets, family)]


def check_nvcc(targets: list[Target], nvcc: tuple[int, int], nvcc_archs: set[str]) -> None:
    """nvcc must target every arch and be new enough for every family it compiles."""
    support.check_nvcc_archs(targets, nvcc, nvcc_archs)
    for family in families_for(targets):
        chosen, info = family_targets(targets, family), archs.FAMILIES[family]
        if nvcc < archs.version_tuple(info["min_cuda"]):
            raise BuildConfigError(
                f"{family} kernels (archs {', '.join(t.arch for t in chosen)}) need CUDA >= {info['min_cuda']}; "
                f"nvcc is {_version(nvcc)}. Use a newer CUDA toolkit or drop these archs from TORCH_CUDA_ARCH_LIST")


def family_sources(family: str, root: Path = ROOT) -> list[str]:
    """Every .cu and .cpp of csrc/<family>/, relative to `root`; bindings.cpp is the one that includes torch."""
    folder = root / CSRC / family
    sources = sorted(p.relative_to(root).as_posix() for ext in ("*.cu", "*.cpp") for p in folder.glob(ext))
    if f"{CSRC}/{family}/bindings.cpp" not in sources:
        raise BuildConfigError(f"{CSRC}/{family}/bindings.cpp is missing: the {family} extension needs its "
                               f"Python binding (found {sources or 'no sources'})")
    return sources


def only_families(extensions: list[Extension], names: str | None, arch_list: str) -> list[Extension]:
    """SAGE_BUILD_FAMILIES (e.g. "sm90" or "sm80,sm89"): build only these of the planned modules, for kernel work or
    to build the modules in parallel processes. None or empty: all of them."""
    if not names:
        return extensions
    wanted = [n for n in re.split(r"[;, ]+", names.strip()) if n]
    unknown = [n for n in wanted if n not in archs.FAMILIES]
    if unknown:
        raise BuildConfigError(f"SAGE_BUILD_FAMILIES names {', '.join(unknown)}; the families are "
                               f"{', '.join(archs.FAMILIES)}")
    planned = {e.name.removeprefix("sageattention._C_"): e for e in extensions}
    missing = [n for n in wanted if n not in planned]
    if missing:
        raise BuildConfigError(f"SAGE_BUILD_FAMILIES names {', '.join(missing)}, which TORCH_CUDA_ARCH_LIST="
                               f"{arch_list} does not build (it builds {', '.join(planned) or 'nothing'})")
    return [planned[n] for n in dict.fromkeys(wanted)]


def plan(arch_list: str | None, nvcc_version_output: str, nvcc_arch_output: str,
         root: Path = ROOT, families: str | None = None) -> list[Extension]:
    """The extensions to build for TORCH_CUDA_ARCH_LIST (None or empty: every arch nvcc supports) and this nvcc,
    narrowed to `families` (SAGE_BUILD_FAMILIES) when given."""
    nvcc = parse_nvcc_version(nvcc_version_output)
    nvcc_archs = parse_nvcc_archs(nvcc_arch_output)
    arch_list = arch_list or default_arch_list(nvcc_archs)
    targets = parse_arch_list(arch_list)
    check_nvcc(targets, nvcc, nvcc_archs)
    extensions = []
    for family in families_for(targets):
        flags = NVCC_FLAGS + [flag for t in family_targets(targets, family) for flag in t.gencode()]
        f16_accum = archs.FAMILIES[family].get("f16_accum") and nvcc >= archs.version_tuple(
            archs.FP8_F16_ACCUM_MIN_CUDA)
        extensions.append(Extension(f"sageattention._C_{family}", family_sources(family, root), flags,
                                    [FP8_F16_ACCUM_MACRO] if f16_accum else [],
                                    [str(root / CSRC), str(root / BINDING_INCLUDE)]))
    return only_families(extensions, families, arch_list)
