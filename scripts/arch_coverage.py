"""Which GPUs a build's device code runs on: the -gencode flags that build_rules.plan gives nvcc for a variant, read
with CUDA's compatibility rules, against the archs the package claims (its archs.py).

A build claims every arch of its package's archs.py that its nvcc can target (variants/toolchain.yaml); an arch
its nvcc cannot target is claimed only where other code of the build runs there (sm_120 SASS on sm_121).
"""
from __future__ import annotations

import re
from functools import cache

import build_rules
from scripts.variants import ROOT, VARIANTS_DIR, Variant, _Facts

# "-gencode=arch=compute_121a,code=sm_121a" -> "sm_121a"; code=compute_… is PTX.
_GENCODE = re.compile(r"-gencode=arch=compute_\d+[af]?,code=((?:sm|compute)_\d+[af]?)$")
_CODE = re.compile(r"(sm|compute)_(\d+)(\d)([af]?)")


def cap(arch: str) -> tuple[int, int]:
    major, minor = arch.split(".")
    return int(major), int(minor)


def codes(flags: list[str]) -> list[str]:
    """The device codes nvcc emits for these flags: "sm_90a" (SASS), "compute_120" (PTX)."""
    return [m[1] for m in map(_GENCODE.match, flags) if m]


def runs_on(code: str, arch: str) -> bool:
    """Whether a GPU of compute capability `arch` runs `code`. SASS sm_XY runs on X.z for z >= Y (binary
    compatibility within a major), and so does a family target sm_XYf (sm_100f: 10.0, 10.3; sm_120f: 12.0, 12.1);
    an arch-specific sm_XYa runs on X.Y alone. Plain PTX compute_XY is JIT-compiled by the driver on every GPU
    >= X.Y; `a`/`f` PTX keeps its SASS's reach."""
    kind, major, minor, suffix = _CODE.fullmatch(code).groups()
    own, gpu = (int(major), int(minor)), cap(arch)
    if suffix == "a":
        return gpu == own
    if kind == "compute" and not suffix:
        return gpu >= own
    return gpu[0] == own[0] and gpu[1] >= own[1]


@cache
def _toolchain() -> _Facts:
    return _Facts(VARIANTS_DIR)


@cache
def sage3_rules():
    # sageattn3's build_rules.py shares its module name with sageattention's; build_support is already imported.
    return build_rules.support.load_by_path(ROOT / "sageattention3_blackwell/build_rules.py", "_sageattn3_build_rules")


def claimable(package: str) -> dict:
    """The package's arch table: compute capability -> the compiled kernel (family) that serves it."""
    return build_rules.archs.ARCH_FAMILY if package == "sageattention" else sage3_rules().archs.ARCH_KERNEL


def plan(v: Variant) -> list:
    """The extensions (build_rules.Extension) the variant's build compiles: its TORCH_CUDA_ARCH_LIST, with the nvcc of
    its CUDA line (whose --list-gpu-arch is reduced to that list)."""
    arch_list = v.arch_list or v.cuda_arch_list
    version = f"Cuda compilation tools, release {v.cuda}, V{v.cuda}.0"
    listing = "\n".join(f"compute_{a.replace('.', '')}" for a in arch_list.split(";"))
    rules = build_rules if v.package == "sageattention" else sage3_rules()
    return rules.plan(arch_list, version, listing)


def planned_codes(v: Variant) -> dict[str, list[str]]:
    """Extension module -> the device codes its build would compile."""
    return {e.name: codes(e.nvcc_flags) for e in plan(v)}


def module_serves(v: Variant, module: str, arch: str) -> bool:
    """sageattention: the module is the family archs.py routes `arch` to; sageattn3: its one module serves every arch."""
    family = claimable(v.package)[arch]
    return v.package == "sageattn3" or module == f"sageattention._C_{family}"


def served(v: Variant) -> list[str]:
    """The claimable archs whose kernel module in this build has device code that runs there."""
    plans = planned_codes(v)
    return [a for a in claimable(v.package)
            if any(module_serves(v, m, a) and any(runs_on(c, a) for c in cs) for m, cs in plans.items())]


def claimed(v: Variant) -> list[str]:
    """The archs this build must serve: those of archs.py that its nvcc can target, plus any it serves anyway."""
    targetable = _toolchain().archs(list(claimable(v.package)), v.cuda)
    serves = served(v)
    return [a for a in claimable(v.package) if a in targetable or a in serves]


def unserved(v: Variant) -> list[str]:
    """Claimed archs that no device code of this build runs on (empty for a sound build)."""
    serves = served(v)
    return [a for a in claimed(v) if a not in serves]
