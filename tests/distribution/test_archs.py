"""Each package's arch table (what the build targets and dispatch serves) agrees with its variants/ file:
sageattention/archs.py with variants/sageattention.yaml, sageattn3/archs.py with variants/sageattn3.yaml."""
import re
import shutil
import subprocess
from dataclasses import replace

import pytest
import yaml

import build_rules
from build_rules import archs  # archs.py loaded by path: the package itself would import torch
from scripts import arch_coverage
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


@pytest.mark.parametrize("code, yes, no", [
    ("sm_120a", ["12.0"], ["12.1", "10.0"]),  # arch-specific SASS: that arch alone
    ("sm_120f", ["12.0", "12.1"], ["10.0", "10.3"]),  # family SASS: the family
    ("sm_100", ["10.0", "10.3"], ["12.0", "9.0"]),  # plain SASS: newer minors of its major
    ("compute_90", ["9.0", "12.1"], ["8.9"]),  # plain PTX: every newer GPU (JIT)
    ("compute_90a", ["9.0"], ["10.0"]),
])
def test_compatibility_rules(code, yes, no):
    assert all(arch_coverage.runs_on(code, a) for a in yes) and not any(arch_coverage.runs_on(code, a) for a in no)


def _builds(package):
    """One variant per distinct (package, CUDA, arch list): the others build the same device code."""
    return list({(v.cuda, v.cuda_arch_list): v for v in load(package).variants}.values())


@pytest.mark.parametrize("package", ["sageattention", "sageattn3"])
def test_every_build_has_code_for_every_arch_it_claims(package):
    for v in _builds(package):
        missing = arch_coverage.unserved(v)
        assert not missing, f"{v.name}: no device code of {arch_coverage.planned_codes(v)} runs on {missing}"
        assert set(arch_coverage.served(v)) <= set(arch_coverage.claimed(v))


def test_a_build_that_drops_a_targetable_arch_fails_the_check():
    v = next(v for v in load("sageattn3").variants if v.cuda == "12.9")
    assert arch_coverage.unserved(replace(v, cuda_arch_list="10.0;12.0")) == ["12.1"]  # sm_120a cannot run on sm121
    v = next(v for v in load("sageattention").variants if v.cuda == "12.9")
    # sm_80 SASS serves 8.6 and 8.7; the sm89 family's sm_89 and sm_121 SASS run on neither 10.x nor 12.0
    assert arch_coverage.unserved(replace(v, cuda_arch_list="8.0;8.9;9.0a;12.1")) == ["10.0", "10.3", "12.0"]


def test_a_cuda_12_8_build_does_not_claim_sm121_for_sageattn3():
    v = next(v for v in load("sageattn3").variants if v.cuda == "12.8")
    assert "12.1" not in arch_coverage.claimed(v) and "12.1" not in v.cuda_arch_list.split(";")


def test_nvcc_puts_the_planned_sageattn3_targets_in_the_binary(tmp_path):
    """Compile one translation unit (csrc/quantize.cu) as a CUDA >= 12.9 variant plans it; read the cubins back."""
    from sageattention.bench import sass_loops

    nvcc, tool = shutil.which("nvcc"), sass_loops.cuobjdump()
    if not nvcc or not tool:
        pytest.skip("needs nvcc and cuobjdump")
    release = re.search(r"release (\d+\.\d+)", subprocess.run([nvcc, "--version"], capture_output=True,
                                                                   text=True).stdout)[1]
    v = next(v for v in load("sageattn3").variants if v.platform == "linux-64" and v.cuda == "12.9")
    if tuple(map(int, release.split("."))) < (12, 9):
        pytest.skip(f"nvcc {release} has no sm_121")
    (extension,) = arch_coverage.plan(v)
    out = tmp_path / "quantize.o"
    subprocess.run([nvcc, "-c", str(ROOT / "sageattention3_blackwell/csrc/quantize.cu"), "-o", str(out),
                    *extension.nvcc_flags], check=True, capture_output=True)
    elf = subprocess.run([tool, "-elf", str(out)], capture_output=True, text=True, check=True).stdout
    cubins = re.findall(r"^arch = (sm_\d+[af]?)$", elf, re.M)
    assert sorted(cubins) == sorted(arch_coverage.planned_codes(v)["sageattn3._C"]) == ["sm_100a", "sm_120a", "sm_121a"]
    assert all(any(arch_coverage.runs_on(c, a) for c in cubins) for a in arch_coverage.claimed(v))
