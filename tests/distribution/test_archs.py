"""Each package's arch table (what the build targets and dispatch serves) agrees with its variants/ file:
sageattention/archs.py with variants/sageattention.yaml, sageattn3/archs.py with variants/sageattn3.yaml."""
import yaml

import build_rules
from build_rules import archs  # archs.py loaded by path: the package itself would import torch
from scripts.variants import ROOT, VARIANTS_DIR, load

ARCH_LISTS = yaml.safe_load((VARIANTS_DIR / "sageattention.yaml").read_text())["arch_lists"]
SAGE3 = build_rules.support.load_by_path(ROOT / "sageattention3_blackwell/sageattn3/archs.py", "_sageattn3_archs")


def test_every_built_arch_has_a_kernel_family():
    for name, built in ARCH_LISTS.items():
        assert set(built) <= set(archs.ARCH_FAMILY), \
            f"arch list {name!r} builds {sorted(set(built) - set(archs.ARCH_FAMILY))}, which archs.py does not serve"


def test_extended_list_builds_every_served_arch():
    missing = set(archs.ARCH_FAMILY) - set(ARCH_LISTS["extended"])
    assert not missing, f"archs.py serves {sorted(missing)}, which the 'extended' arch list does not build"


def test_every_family_names_its_requirements():
    # a family of arch-specific features ("only") may be built before dispatch serves any arch with it
    assert set(archs.ARCH_FAMILY.values()) | {f for f, info in archs.FAMILIES.items() if "only" in info} \
        == set(archs.FAMILIES)
    for family, info in archs.FAMILIES.items():
        assert {"pv", "min_arch", "min_cuda"} <= set(info), f"{family} lacks a requirement"
        if "only" in info:
            assert set(info["only"]) <= set(archs.ARCH_FAMILY) and info["suffix"] in ("a", "f"), family
    for arch, family in archs.ARCH_FAMILY.items():
        assert archs.version_tuple(arch) >= archs.version_tuple(archs.FAMILIES[family]["min_arch"]), \
            f"{arch} is served by {family}, whose instructions start at {archs.FAMILIES[family]['min_arch']}"


def test_sageattn3_builds_only_archs_its_kernels_serve():
    for name, built in yaml.safe_load((VARIANTS_DIR / "sageattn3.yaml").read_text())["arch_lists"].items():
        assert set(built) <= set(SAGE3.ARCH_KERNEL), \
            f"sageattn3 arch list {name!r} builds {sorted(set(built) - set(SAGE3.ARCH_KERNEL))}, which archs.py lacks"
    kernels = {p.stem.removeprefix("attention_") for p in (ROOT / "sageattention3_blackwell/csrc").glob("attention_*.cu")}
    assert set(SAGE3.ARCH_KERNEL.values()) == kernels and SAGE3.ARCH_SUFFIX in ("a", "f")


def test_sageattn3_variants_keep_to_its_cuda_floor():
    matrix = load("sageattn3")
    assert matrix.min_cuda == SAGE3.MIN_CUDA
    assert all(tuple(map(int, v.cuda.split("."))) >= tuple(map(int, SAGE3.MIN_CUDA.split("."))) for v in matrix.variants)
