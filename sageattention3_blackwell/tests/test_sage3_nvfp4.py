"""Exact FP4 e2m1 / FP8 e4m3 quantize-dequantize on known values."""
import pytest
import torch

from sageattn3 import nvfp4


def test_e2m1_codes_decode_to_the_grid():
    codes = torch.arange(16, dtype=torch.uint8)
    expected = [0, .5, 1, 1.5, 2, 3, 4, 6, 0, -.5, -1, -1.5, -2, -3, -4, -6]
    assert nvfp4.decode_e2m1(codes).tolist() == expected


@pytest.mark.parametrize("value, code", [
    (0.0, 0), (0.24, 0), (0.25, 0), (0.26, 1),        # 0.25 is a tie: goes to the even code 0
    (0.75, 2), (1.25, 2), (1.26, 3), (1.75, 4),        # ties 0.75 -> 1.0 and 1.25 -> 1.0, 1.75 -> 2.0
    (2.5, 4), (2.6, 5), (3.5, 6), (5.0, 6), (5.01, 7),  # ties 2.5 -> 2, 3.5 -> 4, 5 -> 4
    (6.0, 7), (100.0, 7),                              # saturates at 6
    (-0.5, 9), (-3.0, 13), (-7.0, 15), (-0.1, 0),      # negative values; tiny ones round to +0
])
def test_e2m1_round_to_nearest_even(value, code):
    assert nvfp4.encode_e2m1(torch.tensor([value])).item() == code


def test_pack_puts_the_first_element_in_the_low_nibble():
    codes = torch.tensor([[1, 2, 15, 7]], dtype=torch.uint8)
    packed = nvfp4.pack_nibbles(codes)
    assert packed.tolist() == [[0x21, 0x7F]]
    assert torch.equal(nvfp4.unpack_nibbles(packed), codes)


def test_group_scale_is_amax_over_6_rounded_to_e4m3():
    x = torch.zeros(3, 16)
    x[0, 5] = 6.0        # scale exactly 1.0
    x[1, 0] = -2688.0    # scale 448, the e4m3 maximum
    x[2, 9] = 6.0 * 1.0625  # 1.0625 lies halfway between e4m3 1.0 and 1.125: rounds to even (1.0)
    assert nvfp4.group_scales(x).float().flatten().tolist() == [1.0, 448.0, 1.0]
    assert nvfp4.group_scales(torch.full((1, 16), 1e6)).float().item() == 448.0  # clamped, never NaN


def test_quantize_dequantize_is_exact_on_representable_values():
    grid = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -.5, -1, -1.5, -2, -3, -4, -6, 6])
    scales = torch.tensor([0.25, 1.0, 3.0, 0.009765625, 448.0])  # all exact in e4m3 (one is subnormal)
    x = grid[None, :] * scales[:, None]
    codes, s = nvfp4.quantize(x)
    assert s.float().flatten().tolist() == scales.tolist()
    assert torch.equal(nvfp4.dequantize(codes, s), x)


def test_known_group_quantizes_to_expected_codes():
    x = torch.tensor([[12.0, -6.0, 1.0, 0.4, 7.0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.1]])  # amax 12: scale 2
    codes, s = nvfp4.quantize(x)
    assert s.float().item() == 2.0
    # 12/2=6 -> 7; -3 -> 13; 0.5 -> 1; 0.2 -> 0; 3.5 (tie) -> 6 (value 4); 0.05 -> 0
    assert nvfp4.unpack_nibbles(codes)[0, :5].tolist() == [7, 13, 1, 0, 6]
    assert nvfp4.dequantize(codes, s)[0, :5].tolist() == [12.0, -6.0, 1.0, 0.0, 8.0]


def test_all_zero_group_has_zero_scale_and_codes():
    codes, s = nvfp4.quantize(torch.zeros(2, 32))
    assert not codes.any() and not s.float().any()


def test_random_roundtrip_error_matches_nvfp4_on_gaussians():
    x = torch.randn(512, 128)
    err = (nvfp4.dequantize(*nvfp4.quantize(x)) - x).norm() / x.norm()
    assert 0.05 < err < 0.12  # NVFP4 on N(0,1) loses ~10%; far off means a broken encoder


def test_quantize_rejects_a_dim_not_multiple_of_16():
    with pytest.raises(ValueError, match="multiple of 16"):
        nvfp4.quantize(torch.ones(4, 24))
