"""The matrix in variants/: seed rows, current rows, profiles, arch lists, and the errors for bad data."""
import shutil

import pytest
import yaml

from scripts.variants import PACKAGES, VariantError, load

EXTENDED = "8.0;8.6;8.7;8.9;9.0;10.0;10.3;12.0;12.1"

# The seed documents' rows, per platform: (package, torch, CUDA, Python) as written there.
SEED_ROWS = (
    [("sageattention", "2.6.0", "12.6.1", py) for py in ("3.9", "3.10", "3.11", "3.12")]
    + [("sageattention", "2.7.0", "12.8.1", py) for py in ("3.10", "3.11", "3.12")]
    + [("sageattention", "2.8.0", "12.9.1", py) for py in ("3.10", "3.11", "3.12")]
    + [("sageattn3", t, c, py) for t, c in (("2.7.0", "12.8.1"), ("2.8.0", "12.9.1"))
       for py in ("3.10", "3.11", "3.12", "3.13")]
)

# What conda-forge can build each seed row as: (platform, torch, CUDA) → (conda torch, conda CUDA).
CONDA_FOR_SEED = {
    ("linux-64", "2.6.0", "12.6.1"): ("2.6.0", "12.6"),
    ("linux-64", "2.7.0", "12.8.1"): ("2.7.1", "12.9"),
    ("linux-64", "2.8.0", "12.9.1"): ("2.8.0", "12.9"),
    ("win-64", "2.6.0", "12.6.1"): ("2.6.0", "12.6"),
    ("win-64", "2.7.0", "12.8.1"): ("2.7.0", "12.8"),
    ("win-64", "2.8.0", "12.9.1"): ("2.8.0", "12.8"),
}


def seeds(platform):
    return [v for p in ("sageattention", "sageattn3") for v in load(p).variants
            if v.platform == platform and v.row_set == "seed"]


@pytest.mark.parametrize("platform", ["linux-64", "win-64"])
def test_every_seed_row_exists_once_per_platform(platform):
    got = sorted((v.package, v.requested_torch, v.requested_cuda, v.python) for v in seeds(platform))
    assert got == sorted(SEED_ROWS)
    assert len(got) == 18


@pytest.mark.parametrize("platform", ["linux-64", "win-64"])
def test_seed_rows_map_to_what_conda_forge_ships(platform):
    for v in seeds(platform):
        torch, cuda = CONDA_FOR_SEED[(platform, v.requested_torch, v.requested_cuda)]
        assert (v.torch_version, v.cuda) == (torch, cuda), v.name
        assert (v.substitute is not None) == ((torch, cuda) != (v.requested_torch, v.requested_cuda[:4]))


def test_seed_wheel_names_match_the_seed_documents():
    by_name = {v.name: v for v in seeds("win-64") + seeds("linux-64")}
    assert by_name["linux-sage2-pytorch26-cu126-python39"].wheel == \
        "sageattention-2.2.0-260.126-cp39-cp39-linux_x86_64.whl"
    assert by_name["linux-sage3-pytorch28-cu129-python312"].wheel == \
        "sageattn3-1.0.0-280.129-cp312-cp312-linux_x86_64.whl"
    assert by_name["windows-sage3-pytorch27-cu128-python313"].wheel == \
        "sageattn3-1.0.0-270.128-cp313-cp313-win_amd64.whl"
    # linux-64 has no torch 2.7 + CUDA 12.8 pytorch: the substitute's CUDA shows in the build tag.
    assert by_name["linux-sage3-pytorch27-cu128-python312"].wheel == \
        "sageattn3-1.0.0-270.129-cp312-cp312-linux_x86_64.whl"


def test_current_rows_cover_torch_29_to_212_where_conda_forge_has_them():
    m = load("sageattn3")
    linux = {(v.torch, v.cuda, v.python) for v in m.variants if v.row_set == "current" and v.platform == "linux-64"}
    expected = {("2.9", "12.9", py) for py in ("3.10", "3.11", "3.12", "3.13")}
    expected |= {(t, c, py) for t in ("2.10", "2.11", "2.12") for c in ("12.9", "13.0")
                 for py in ("3.10", "3.11", "3.12", "3.13", "3.14")}
    assert linux == expected
    win = {(v.torch, v.cuda) for v in m.variants if v.row_set == "current" and v.platform == "win-64"}
    assert win == {(t, "12.8") for t in ("2.9", "2.10", "2.11", "2.12")}
    assert {(u.torch, u.cuda, u.platform) for u in m.unavailable} == \
        {(t, "13.0", "win-64") for t in ("2.10.0", "2.11.0", "2.12.0")}


PROFILE_COUNTS = {
    "sageattention": {"default": 1, "stable": 3, "pytorch26": 4, "pytorch27": 3, "pytorch28": 3, "python39": 1,
                      "python310": 3, "python311": 3, "python312": 3, "sage2-all": 10, "all": 2, "linux": 2,
                      "current": 36, "current-stable": 9, "pytorch29": 4, "pytorch210": 12, "cu130": 16,
                      "stable-abi": 2},
    "sageattn3": {"default": 1, "stable": 2, "pytorch27": 4, "pytorch28": 4, "python310": 2, "python311": 2,
                  "python312": 2, "python313": 2, "sage3-all": 8, "current": 36, "pytorch212": 10, "stable-abi": 2},
}


@pytest.mark.parametrize("package,profile,count",
                         [(p, n, c) for p, counts in PROFILE_COUNTS.items() for n, c in counts.items()])
def test_profile_sizes_on_linux(package, profile, count):
    assert len(load(package).select(profile, "linux-64")) == count


@pytest.mark.parametrize("package", PACKAGES)
def test_stable_abi_rows_build_once_per_cuda_line_and_platform(package):
    m = load(package)
    stable = m.select("stable-abi")
    assert sorted((v.platform, v.cuda) for v in stable) == [
        ("linux-64", "12.9"), ("linux-64", "13.0"), ("linux-aarch64", "12.9"), ("linux-aarch64", "13.0"),
        ("win-64", "12.8")]
    for v in stable:
        assert (v.variant_config()["stable_abi"], v.build_tag) == ("1", f"2100up.{v.cuda.replace('.', '')}")
        assert v.wheel.endswith(f"-cp310-abi3-{v.wheel_platform}.whl") and v.name.split("-")[-3] == "pytorch210up"
    version_specific = [v for v in m.variants if not v.stable]
    assert {v.variant_config()["stable_abi"] for v in version_specific} == {"0"}
    assert len({v.wheel for v in m.variants}) == len(m.variants)
    # Torch 2.9's four Pythons stay version-specific; the two stable builds serve torch 2.10 and up on linux-64.
    assert m.binaries("current", "linux-64") == (34, 6) and m.binaries("stable-abi", "linux-64") == (0, 2)
    assert m.binaries("pytorch29", "linux-64") == (4, 4)


def test_named_profiles_pick_the_documented_rows():
    default = load("sageattn3").select("default", "linux-64")
    assert [(v.torch, v.cuda, v.python) for v in default] == [("2.8", "12.9", "3.12")]
    stable = load("sageattn3").select("stable", "win-64")
    assert [(v.requested_torch, v.python) for v in stable] == [("2.7.0", "3.13"), ("2.8.0", "3.13")]
    legacy = load("sageattention").select("all", "linux-64")
    assert [(v.torch, v.python) for v in legacy] == [("2.7", "3.12"), ("2.8", "3.12")]
    assert [v.requested_torch for v in load("sageattention").select("stable", "linux-64")] == \
        ["2.6.0", "2.7.0", "2.8.0"]


def test_arch_lists_follow_what_each_nvcc_can_target():
    sage2 = {(v.platform, v.cuda): v.cuda_arch_list for v in load("sageattention").variants}
    assert sage2[("linux-64", "12.9")] == EXTENDED
    assert sage2[("linux-64", "13.0")] == EXTENDED
    assert sage2[("win-64", "12.8")] == "8.0;8.6;8.7;8.9;9.0;10.0;12.0"
    assert sage2[("linux-64", "12.6")] == "8.0;8.6;8.7;8.9;9.0"
    sage3 = {(v.platform, v.cuda): v.cuda_arch_list for v in load("sageattn3").variants}
    assert sage3[("win-64", "12.8")] == "10.0;12.0"  # CUDA 12.8 has no sm_121
    assert {sage3[k] for k in sage3 if k[1] != "12.8"} == {"10.0;12.0;12.1"}


def test_standard_arch_list_is_selectable(variants_copy):
    edit(variants_copy, "sageattention.yaml", lambda d: d.update(arch_list="standard"))
    lists = {v.cuda_arch_list for v in load("sageattention", variants_copy).variants if v.cuda == "12.9"}
    assert lists == {"8.0;8.6;8.9;9.0;12.0"}


@pytest.fixture
def variants_copy(tmp_path):
    from scripts.variants import VARIANTS_DIR
    return shutil.copytree(VARIANTS_DIR, tmp_path / "variants")


def edit(root, name, change):
    data = yaml.safe_load((root / name).read_text())
    change(data)
    (root / name).write_text(yaml.safe_dump(data))


def test_an_arch_nvcc_dropped_leaves_the_newer_lines(variants_copy):
    """toolchain.yaml's `until`: CUDA 13 dropped sm_70, so a list asking for it keeps it only on CUDA 12."""
    edit(variants_copy, "sageattention.yaml", lambda d: d["arch_lists"]["extended"].insert(0, "7.0"))
    lists = {v.cuda: v.cuda_arch_list for v in load("sageattention", variants_copy).variants
             if v.platform == "linux-64"}
    assert lists["12.9"] == "7.0;" + EXTENDED
    assert lists["13.0"] == EXTENDED


def test_unknown_package_and_profile_name_what_is_supported():
    with pytest.raises(VariantError, match="unknown package 'flash'.*sageattention, sageattn3"):
        load("flash")
    with pytest.raises(VariantError, match="unknown profile 'nightly'.*default, stable"):
        load("sageattn3").select("nightly")


def test_sage3_below_cuda_128_is_refused(variants_copy):
    edit(variants_copy, "sageattn3.yaml", lambda d: d["seed_rows"].append(
        {"torch": "2.6.0", "cuda": "12.6.1", "python": ["3.12"]}))
    with pytest.raises(VariantError, match=r"^Sage3 is only supported on CUDA 12\.8 and above \(.*12\.6"):
        load("sageattn3", variants_copy)


def test_a_substitute_below_cuda_128_is_refused_for_sage3(variants_copy):
    edit(variants_copy, "sageattn3.yaml", lambda d: d["seed_rows"][0]["conda"].update(
        {"linux-64": {"torch": "2.7.0", "cuda": "12.6", "why": "the old CUDA line"}}))
    with pytest.raises(VariantError, match="Sage3 is only supported on CUDA 12.8 and above"):
        load("sageattn3", variants_copy)


def test_a_row_conda_forge_cannot_build_needs_a_substitute(variants_copy):
    edit(variants_copy, "sageattention.yaml", lambda d: d["seed_rows"][1].pop("conda"))
    with pytest.raises(VariantError, match="no pytorch 2.7.0 build with CUDA 12.8 on linux-64.*substitute"):
        load("sageattention", variants_copy)


def test_python_without_pytorch_is_refused(variants_copy):
    edit(variants_copy, "sageattention.yaml", lambda d: d["seed_rows"][2]["python"].append("3.14"))
    with pytest.raises(VariantError, match="no pytorch 2.8.0 for Python 3.14"):
        load("sageattention", variants_copy)


def test_malformed_data_is_reported_with_its_location(variants_copy):
    edit(variants_copy, "sageattn3.yaml", lambda d: d["seed_rows"][0].update(python="3.12"))
    with pytest.raises(VariantError, match="sageattn3.yaml: bad variant data at seed_rows/0/python"):
        load("sageattn3", variants_copy)


def test_duplicate_builds_are_refused(variants_copy):
    edit(variants_copy, "current.yaml", lambda d: d["rows"].append(dict(d["rows"][0])))
    with pytest.raises(VariantError, match="both build torch 2.9"):
        load("sageattention", variants_copy)
