"""`tl.dot_scaled` for the Triton CPU interpreter (TRITON_INTERPRET=1).

Triton 3.6's interpreter has no `create_dot_scaled`, so a kernel calling `tl.dot_scaled` fails
there. This adds one for the only case sageattn3 uses (e2m1 x e2m1, e4m3 scales per 16 along K,
both operands packed along K), computed exactly in float32 with NumPy. It is installed only when
the running Triton lacks its own.
"""
import numpy as np
import torch

from .nvfp4 import E2M1_MAGNITUDES, GROUP

_E2M1 = np.array(E2M1_MAGNITUDES + tuple(-m for m in E2M1_MAGNITUDES), dtype=np.float32)
_E4M3 = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float().numpy()


def _unpack_along(packed: np.ndarray, axis: int) -> np.ndarray:
    lo, hi = _E2M1[packed & 15], _E2M1[packed >> 4]
    return np.stack((lo, hi), axis=axis + 1).reshape(
        tuple(2 * n if i == axis else n for i, n in enumerate(packed.shape)))


def _create_dot_scaled(self, lhs, lhs_scale, lhs_format, rhs, rhs_scale, rhs_format, fast_math, lhs_k_pack,
                       rhs_k_pack, acc):
    from triton._C.libtriton import ir
    import triton.language as tl

    e2m1 = ir.ScaleDotElemTypeTY.E2M1
    supported = (lhs_format == e2m1 and rhs_format == e2m1 and lhs_k_pack and rhs_k_pack
                 and lhs_scale is not None and rhs_scale is not None
                 and lhs_scale.dtype == tl.float8e4nv and rhs_scale.dtype == tl.float8e4nv)
    if not supported:
        raise NotImplementedError("sageattn3's interpreter dot_scaled covers only e2m1 x e2m1 with e4m3 scales")
    a = _unpack_along(lhs.data, axis=lhs.data.ndim - 1)            # [M, K]
    b = _unpack_along(rhs.data, axis=rhs.data.ndim - 2)            # [K, N]
    a = a * np.repeat(_E4M3[lhs_scale.data.view(np.uint8)], GROUP, axis=-1)
    b = b * np.repeat(_E4M3[rhs_scale.data.view(np.uint8)], GROUP, axis=-1).swapaxes(-1, -2)
    return type(acc)(np.matmul(a, b, dtype=np.float32) + acc.data, acc.dtype.scalar)


def install() -> None:
    from triton.runtime.interpreter import InterpreterBuilder
    if not hasattr(InterpreterBuilder, "create_dot_scaled"):
        InterpreterBuilder.create_dot_scaled = _create_dot_scaled
