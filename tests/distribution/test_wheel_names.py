"""Build strings and build tags decode back to the torch × CUDA × Python they were made from."""
import pytest
from hypothesis import given
from hypothesis import strategies as st
from packaging.utils import parse_wheel_filename

from scripts.variants import PACKAGES, load
from scripts.wheel_names import Flavour, arch_tag, decode_build_tag, from_build_string, is_wheel_named, wheel_flavour

torch = st.builds(lambda minor: f"2.{minor}", st.integers(0, 99))
cuda = st.builds(lambda major, minor: f"{major}.{minor}", st.integers(10, 99), st.integers(0, 9))
python = st.builds(lambda minor: f"3.{minor}", st.integers(8, 99))


@given(st.builds(Flavour, cuda, torch, python))
def test_build_tag_round_trips(flavour):
    assert decode_build_tag(flavour.build_tag) == (flavour.torch, flavour.cuda)
    string = f"cu{flavour.cuda.replace('.', '')}torch{flavour.torch.replace('.', '')}" \
             f"py{flavour.python.replace('.', '')}h0123abc_0"
    assert from_build_string(string) == flavour


def test_a_stable_abi_build_is_named_torch_and_up():
    stable = Flavour("13.0", "2.10", "3.12", stable=True)
    assert stable.build_tag == "2100up.130" and decode_build_tag("2100up.130") == ("2.10", "13.0")
    assert stable.wheel_name("sageattn3", "1.0.0", "linux_x86_64") == \
        "sageattn3-1.0.0-2100up.130-cp310-abi3-linux_x86_64.whl"
    assert from_build_string(f"{stable.build_string_prefix}h0123abc_0") == stable
    assert stable.build_string_prefix == "cu130torch210uppy312"
    assert from_build_string("cu130torch210py312h0123abc_0") == Flavour("13.0", "2.10", "3.12")
    with pytest.raises(ValueError):
        decode_build_tag("2100.up130")


def test_every_matrix_wheel_name_is_pep427_and_decodes():
    for package in PACKAGES:
        for v in load(package).variants:
            name, version, _, _ = parse_wheel_filename(v.wheel)
            assert (str(name), str(version)) == (v.package, v.version)
            assert wheel_flavour(v.wheel) == (v.torch, v.cuda)


@pytest.mark.parametrize("arch_list, tag", [
    ("12.0", "120"), ("9.0a;12.0+PTX", "90a.120ptx"), (" 8.0 8.6,10.0f ", "80.86.100f"),
])
def test_a_build_for_other_archs_is_named_for_them(arch_list, tag):
    variant = next(v for v in load("sageattention").variants if v.cuda == "13.0")
    built = variant.with_arch_list(arch_list)
    assert arch_tag(arch_list, variant.cuda_arch_list) == tag
    assert built.build_string_prefix == f"{variant.build_string_prefix}sm{tag}"
    assert built.build_tag == f"{variant.build_tag}.sm{tag}"
    assert built.wheel != variant.wheel and wheel_flavour(built.wheel) == (variant.torch, variant.cuda)
    assert from_build_string(f"{built.build_string_prefix}h0123abc_0") == built.flavour


@pytest.mark.parametrize("arch_list", [None, "", "  "])
def test_the_variants_own_arch_list_keeps_the_plain_names(arch_list):
    variant = next(v for v in load("sageattention").variants if v.cuda == "13.0")
    for same in (arch_list, variant.cuda_arch_list):
        assert variant.with_arch_list(same).wheel == variant.wheel
        assert variant.with_arch_list(same).build_string_prefix == variant.build_string_prefix


@pytest.mark.parametrize("bad", ["py312h0_0", "cu129torch28h0_0", "cu12torch28py312h0_0", "cu129torch28py312smh0_0"])
def test_foreign_build_strings_are_refused(bad):
    with pytest.raises(ValueError, match="does not look like"):
        from_build_string(bad)


def test_a_manylinux_aarch64_wheel_is_the_linux_aarch64_one_it_was_named():
    want = "sageattn3-1.0.0-280.129-cp312-cp312-linux_aarch64.whl"
    assert is_wheel_named(want, want.replace("linux_aarch64", "manylinux_2_28_aarch64"))
    assert not is_wheel_named(want, want.replace("linux_aarch64", "manylinux_2_28_x86_64"))
    assert not is_wheel_named(want, want.replace("linux_aarch64", "linux_x86_64"))
