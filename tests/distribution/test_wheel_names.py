"""Build strings and build tags decode back to the torch × CUDA × Python they were made from."""
import pytest
from hypothesis import given
from hypothesis import strategies as st
from packaging.utils import parse_wheel_filename

from scripts.variants import PACKAGES, load
from scripts.wheel_names import Flavour, decode_build_tag, from_build_string, wheel_flavour

torch = st.builds(lambda minor: f"2.{minor}", st.integers(0, 99))
cuda = st.builds(lambda major, minor: f"{major}.{minor}", st.integers(10, 99), st.integers(0, 9))
python = st.builds(lambda minor: f"3.{minor}", st.integers(8, 99))


@given(st.builds(Flavour, cuda, torch, python))
def test_build_tag_round_trips(flavour):
    assert decode_build_tag(flavour.build_tag) == (flavour.torch, flavour.cuda)
    string = f"cu{flavour.cuda.replace('.', '')}torch{flavour.torch.replace('.', '')}" \
             f"py{flavour.python.replace('.', '')}h0123abc_0"
    assert from_build_string(string) == flavour


def test_every_matrix_wheel_name_is_pep427_and_decodes():
    for package in PACKAGES:
        for v in load(package).variants:
            name, version, _, _ = parse_wheel_filename(v.wheel)
            assert (str(name), str(version)) == (v.package, v.version)
            assert wheel_flavour(v.wheel) == (v.torch, v.cuda)


@pytest.mark.parametrize("bad", ["py312h0_0", "cu129torch28h0_0", "cu12torch28py312h0_0"])
def test_foreign_build_strings_are_refused(bad):
    with pytest.raises(ValueError, match="does not look like"):
        from_build_string(bad)
