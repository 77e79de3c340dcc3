"""fp32 -> float8 e4m3 conversion that is exact under Triton's CPU interpreter.

Triton 3.6's interpreter mis-rounds the cast when rounding carries into the next binade
(31.93 -> 16 instead of 32). Under the interpreter we first round to the e4m3 grid in fp32
(round to nearest even, via the 1.5 * 2**23 trick), so the cast itself is exact; on GPUs the
hardware cast (cvt.rn.satfinite) is used directly.
"""
import os

import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def to_e4m3(x, EXACT_ROUND: tl.constexpr):
    if EXACT_ROUND:
        exp = ((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
        ulp = ((tl.maximum(exp, -6) - 3 + 127) << 23).to(tl.float32, bitcast=True)  # e4m3: 3 mantissa bits, min exp -6
        magic = ulp * 12582912.0  # 1.5 * 2**23 ulps: adding and subtracting it rounds to a multiple of ulp
        r = (x + magic) - magic
        r = tl.where(r == 0.0, x * 0.0, r)  # tiny negatives round to -0, as the cast does, not +0
        x = tl.minimum(tl.maximum(r, -448.0), 448.0)
    return x.to(tl.float8e4nv)
