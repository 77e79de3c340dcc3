"""The Triton NVFP4 path's version floor: older Triton (torch 2.7/2.8 pins) gets a clear error, 3.6+ passes."""
import pytest

from sageattn3.dispatch import require_nvfp4_triton


@pytest.mark.parametrize("version", ["3.3.1", "3.4.0", "3.5.1"])
def test_old_triton_is_refused_with_a_clear_message(version):
    with pytest.raises(RuntimeError, match=rf"Triton >= 3\.6.*Triton {version} is installed.*backend='cuda'"):
        require_nvfp4_triton(version)


@pytest.mark.parametrize("version", ["3.6.0", "3.7.1", "4.0.0"])
def test_nvfp4_capable_triton_passes(version):
    require_nvfp4_triton(version)
