"""sageattention's tests: CPU runs use Triton's interpreter; shared helpers importable as `tests.sageattention.helpers`.

TRITON_INTERPRET must be set before triton or sageattention is imported (the kernels read it at import
time), so it is set here, at conftest import, and only when there is no GPU: GPU runs use real kernels.
The tooling tests collected before this folder import neither (tests/ci/test_torch_free.py checks that).
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# The tests pin what the quantized kernels compute, at sizes where sageattn would hand the problem to SDPA;
# test_routing.py turns the hand-over back on where it tests it.
os.environ.setdefault("SAGEATTN_SDPA_FALLBACK", "0")


def pytest_configure(config):
    # numpy warnings from the interpreter's emulation of masked lanes (log2(0), 0/0 on padding rows)
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:triton.runtime.interpreter")


@pytest.fixture(autouse=True)
def _fresh_call_setups():
    """core keeps each call signature's checks and route; tests that fake a GPU or a build must not see another
    test's answers."""
    from sageattention import core

    core._prepared.clear()
