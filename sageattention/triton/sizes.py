"""Integer helpers for launch sizes. triton.cdiv / next_power_of_2 are constexpr functions in Triton 3.6, whose
host-side calls cost microseconds each (argument unwrapping); sageattn makes about a dozen per call."""


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (n >= 1)."""
    return 1 << (n - 1).bit_length()
