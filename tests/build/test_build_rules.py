"""build_rules.py: which extension modules sageattention builds, for which archs, with which nvcc. Torch-free."""
import pytest

import build_rules
from build_rules import BuildConfigError, Target, family_sources, family_targets, parse_arch_list, plan

# What nvcc 12.6 and 13.0 print for --version and --list-gpu-arch (13.0's list as this machine's nvcc prints it).
NVCC_12_6 = ("Cuda compilation tools, release 12.6, V12.6.85",
             "compute_50\ncompute_52\ncompute_53\ncompute_60\ncompute_61\ncompute_62\ncompute_70\ncompute_72\n"
             "compute_75\ncompute_80\ncompute_86\ncompute_87\ncompute_89\ncompute_90\n")
NVCC_13_0 = ("nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\n",
             "compute_75\ncompute_80\ncompute_86\ncompute_87\ncompute_88\ncompute_89\ncompute_90\ncompute_100\n"
             "compute_110\ncompute_103\ncompute_120\ncompute_121\n")


def nvcc(version: str, listing: str = NVCC_13_0[1]) -> tuple:
    """An nvcc of another release with 13.0's arch list (only the version matters to the gate)."""
    return f"Cuda compilation tools, release {version}, V{version}.1", listing


@pytest.fixture
def csrc(tmp_path):
    """A source tree with every family's folder, a shared header and files the build must leave out."""
    for family in ("sm80", "sm89", "sm90"):
        folder = tmp_path / "csrc" / family
        folder.mkdir(parents=True)
        for name in ("bindings.cpp", "attention.cu", "prepare.cu", "tile.cuh", "notes.md"):
            (folder / name).write_text("")
    (tmp_path / "csrc/common").mkdir()
    (tmp_path / "csrc/common/params.h").write_text("")
    return tmp_path


def flags_of(extensions) -> dict:
    return {e.name.removeprefix("sageattention._C_"): e.nvcc_flags for e in extensions}


def gencodes(flags) -> list:
    return [f.removeprefix("-gencode=") for f in flags if f.startswith("-gencode=")]


@pytest.mark.parametrize("text, expected", [
    ("8.0;8.6", [Target("8.0"), Target("8.6")]),
    ("8.0 8.6,8.9;;9.0", [Target("8.0"), Target("8.6"), Target("8.9"), Target("9.0")]),
    ("9.0a;12.0+PTX", [Target("9.0", "a"), Target("12.0", "", True)]),
    ("10.0f 12.1a+PTX", [Target("10.0", "f"), Target("12.1", "a", True)]),
    ("12.0;12.0;12.0a", [Target("12.0"), Target("12.0", "a")]),
])
def test_arch_list_spellings(text, expected):
    assert parse_arch_list(text) == expected


@pytest.mark.parametrize("entry", ["7.5", "7.0", "11.0", "sm_90", "9", "Ampere", "8.0+ptx", "9.0b", "12.0++PTX"])
def test_unsupported_or_malformed_entries_name_what_is_supported(entry):
    with pytest.raises(BuildConfigError) as err:
        parse_arch_list(f"8.0;{entry}")
    assert f"entry {entry!r} is not supported" in str(err.value)
    assert "8.0, 8.6, 8.7, 8.9, 9.0, 10.0, 10.3, 12.0, 12.1" in str(err.value)


def test_a_list_naming_nothing_is_refused():
    with pytest.raises(BuildConfigError, match="names no architecture"):
        parse_arch_list(" ; , ")


def test_gencode_flags_for_suffixes_and_ptx():
    assert Target("8.6").gencode() == ["-gencode=arch=compute_86,code=sm_86"]
    assert Target("9.0", "a").gencode() == ["-gencode=arch=compute_90a,code=sm_90a"]
    assert Target("12.0", "", True).gencode() == ["-gencode=arch=compute_120,code=sm_120",
                                                  "-gencode=arch=compute_120,code=compute_120"]


def test_mixed_list_9_0_and_12_0_builds_both_families_for_both_archs(csrc):
    # Upstream SageAttention fails on this list; here each family just compiles for the archs it can use.
    found = flags_of(plan("9.0;12.0", *NVCC_13_0, root=csrc))
    expected = ["arch=compute_90,code=sm_90", "arch=compute_120,code=sm_120"]
    assert gencodes(found["sm80"]) == expected and gencodes(found["sm89"]) == expected
    assert gencodes(found["sm90"]) == ["arch=compute_90a,code=sm_90a"]


def test_each_family_gets_only_the_archs_that_have_its_instructions(csrc):
    found = flags_of(plan("8.0;8.6;9.0a;12.0+PTX", *NVCC_13_0, root=csrc))
    assert gencodes(found["sm80"]) == ["arch=compute_80,code=sm_80", "arch=compute_86,code=sm_86",
                                       "arch=compute_90a,code=sm_90a", "arch=compute_120,code=sm_120",
                                       "arch=compute_120,code=compute_120"]
    assert gencodes(found["sm89"]) == ["arch=compute_90a,code=sm_90a", "arch=compute_120,code=sm_120",
                                       "arch=compute_120,code=compute_120"]
    assert gencodes(found["sm90"]) == ["arch=compute_90a,code=sm_90a"]


def test_a_family_with_no_arch_in_the_list_is_not_built(csrc):
    assert list(flags_of(plan("8.0;8.6;8.7", *NVCC_13_0, root=csrc))) == ["sm80"]


@pytest.mark.parametrize("names, built", [("sm90", ["sm90"]), ("sm89, sm80", ["sm89", "sm80"]), ("", None),
                                          (None, None)])
def test_sage_build_families_narrows_the_plan(csrc, names, built):
    found = list(flags_of(plan("8.0;9.0", *NVCC_13_0, root=csrc, families=names)))
    assert found == (built or ["sm80", "sm89", "sm90"])


@pytest.mark.parametrize("names, message", [("sm75", "the families are sm80, sm89, sm90"),
                                            ("sm90", "TORCH_CUDA_ARCH_LIST=8.0;8.9 does not build")])
def test_sage_build_families_names_what_it_cannot_build(csrc, names, message):
    with pytest.raises(BuildConfigError, match=message):
        plan("8.0;8.9", *NVCC_13_0, root=csrc, families=names)


def test_family_targets_follow_archs_py_floors():
    targets = parse_arch_list("8.6;8.9;12.1")
    assert family_targets(targets, "sm80") == targets
    assert family_targets(targets, "sm89") == targets[1:]
    assert family_targets(targets, "sm90") == []


@pytest.mark.parametrize("text", ["9.0", "9.0a", "9.0+PTX", "9.0;9.0a+PTX;10.0;12.0"])
def test_the_sm90_family_is_sm_90a_code_for_9_0_alone(text):
    """wgmma and setmaxnreg exist only as sm_90a features: no other arch, and no PTX a newer GPU could JIT."""
    assert family_targets(parse_arch_list(text), "sm90") == [Target("9.0", "a")]


def test_nvcc_flags_are_explicit_and_without_fast_math(csrc):
    for flags in flags_of(plan("8.9", *NVCC_13_0, root=csrc)).values():
        assert flags[:2] == ["-O3", "-lineinfo"]
        assert "--use_fast_math" not in flags and not any("lcuda" in f for f in flags)
        assert "-U__CUDA_NO_HALF_OPERATORS__" in flags


@pytest.mark.parametrize("version, macro", [("12.4", False), ("12.6", False), ("12.8", True), ("13.0", True)])
def test_f16_accumulating_fp8_mma_only_with_nvcc_12_8(csrc, version, macro):
    # a macro for every compiler of the module: the binding, compiled by the host compiler, reads it too
    found = {e.name.removeprefix("sageattention._C_"): e.macros for e in plan("8.0;8.9;9.0", *nvcc(version), root=csrc)}
    assert (("SAGE_FP8_F16_ACCUM", "1") in found["sm89"]) is macro
    assert found["sm80"] == found["sm90"] == []  # their P·V has no f16-accumulating kernel


def test_nvcc_too_old_for_a_family_names_family_archs_and_version(csrc):
    with pytest.raises(BuildConfigError) as err:
        plan("8.0;8.9;9.0", *nvcc("12.3"), root=csrc)
    assert "sm89 kernels (archs 8.9, 9.0) need CUDA >= 12.4; nvcc is 12.3" in str(err.value)
    with pytest.raises(BuildConfigError, match=r"sm80 kernels \(archs 8.0\) need CUDA >= 11.8; nvcc is 11.7"):
        plan("8.0", *nvcc("11.7"), root=csrc)


def test_nvcc_12_3_still_builds_the_sm80_family_alone(csrc):
    assert list(flags_of(plan("8.0;8.6", *nvcc("12.3"), root=csrc))) == ["sm80"]


def test_an_arch_nvcc_cannot_target_is_refused_before_nvcc_runs(csrc):
    with pytest.raises(BuildConfigError, match=r"nvcc 12.6 cannot compile for 12.0 \(it targets 5.0, .*, 9.0\)"):
        plan("9.0;12.0", *NVCC_12_6, root=csrc)


@pytest.mark.parametrize("arch_list", [None, ""])
def test_default_list_is_every_supported_arch_nvcc_can_target(csrc, arch_list):
    found = flags_of(plan(arch_list, *NVCC_12_6, root=csrc))
    assert [g.split("=")[-1] for g in gencodes(found["sm80"])] == ["sm_80", "sm_86", "sm_87", "sm_89", "sm_90"]
    assert build_rules.default_arch_list(build_rules.parse_nvcc_archs(NVCC_13_0[1])) == \
        "8.0;8.6;8.7;8.9;9.0;10.0;10.3;12.0;12.1"


def test_unreadable_nvcc_version_is_an_error():
    with pytest.raises(BuildConfigError, match="cannot read the CUDA version"):
        build_rules.parse_nvcc_version("command not found")


def test_sources_are_the_familys_cu_and_cpp_files(csrc):
    extensions = plan("8.9", *NVCC_13_0, root=csrc)
    assert [e.name for e in extensions] == ["sageattention._C_sm80", "sageattention._C_sm89"]
    assert extensions[1].sources == ["csrc/sm89/attention.cu", "csrc/sm89/bindings.cpp", "csrc/sm89/prepare.cu"]


def test_a_family_without_its_binding_is_refused(csrc):
    (csrc / "csrc/sm89/bindings.cpp").unlink()
    with pytest.raises(BuildConfigError, match="csrc/sm89/bindings.cpp is missing"):
        family_sources("sm89", csrc)


@pytest.mark.parametrize("value, mode", [(None, "auto"), ("", "auto"), (" 1 ", "on"), ("0", "off")])
def test_sage_build_cuda_modes(value, mode):
    assert build_rules.build_mode(value) == mode


@pytest.mark.parametrize("value", ["yes", "true", "2"])
def test_other_sage_build_cuda_values_are_refused(value):
    with pytest.raises(BuildConfigError, match=f"SAGE_BUILD_CUDA='{value}': use 1 .* 0 .* or leave it unset"):
        build_rules.build_mode(value)


@pytest.mark.parametrize("family", list(build_rules.archs.FAMILIES))
def test_every_family_has_its_sources_and_one_binding_in_the_repository(family):
    sources = family_sources(family)
    assert [s for s in sources if s.endswith(".cu")], f"csrc/{family}/ has no .cu kernels"
    # Only the binding may include torch: the kernels compile with plain nvcc (their SASS tests do so).
    for source in sources:
        if source != f"csrc/{family}/bindings.cpp":
            text = (build_rules.ROOT / source).read_text()
            assert "torch/" not in text and "binding.h" not in text, f"{source} includes torch"


@pytest.mark.parametrize("torch_version, setting, stable", [
    ("2.10.0", None, True), ("2.14.1+cu130", "", True), ("2.13.0+cpu", "0", False), ("2.9.1", None, False),
    ("2.8.0", "0", False), ("2.11.0", "1", True),
])
def test_stable_abi_from_torch_2_10_unless_asked_otherwise(torch_version, setting, stable):
    assert build_rules.support.use_stable_abi(torch_version, setting) is stable


def test_stable_abi_refused_below_torch_2_10_and_bad_settings():
    with pytest.raises(BuildConfigError, match="SAGE_STABLE_ABI=1 needs torch >= 2.10 to build against; found torch 2.9.1"):
        build_rules.support.use_stable_abi("2.9.1", "1")
    with pytest.raises(BuildConfigError, match="SAGE_STABLE_ABI='yes': use 1 .* or 0"):
        build_rules.support.use_stable_abi("2.11.0", "yes")


def test_stable_abi_targets_torch_2_10_and_requires_it():
    # torch/csrc/stable/version.h: TORCH_VERSION_2_10_0 is ((2 << 56) | (10 << 48)).
    assert int(dict(build_rules.support.stable_abi_macros())["TORCH_TARGET_VERSION"], 16) == (2 << 56) | (10 << 48)
    others = build_rules.REQUIREMENTS
    assert build_rules.support.requirements(True, build_rules.TORCH_FLOOR, others) == ["torch>=2.10", *others]
    assert build_rules.support.requirements(False, build_rules.TORCH_FLOOR, others) == ["torch>=2.6", *others]
