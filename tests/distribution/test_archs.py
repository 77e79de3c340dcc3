"""sageattention/archs.py (what the build targets and dispatch serves) agrees with variants/sageattention.yaml."""
import yaml

from build_rules import archs  # archs.py loaded by path: the package itself would import torch
from scripts.variants import VARIANTS_DIR

ARCH_LISTS = yaml.safe_load((VARIANTS_DIR / "sageattention.yaml").read_text())["arch_lists"]


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
