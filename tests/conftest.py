"""sageattention tests: CPU runs use Triton's interpreter; shared helpers importable as `tests.helpers`.

TRITON_INTERPRET must be set before triton or sageattention is imported (the kernels read it at import
time), so it is set here, at conftest import, and only when there is no GPU: GPU runs use real kernels.
"""
import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def pytest_configure(config):
    # numpy warnings from the interpreter's emulation of masked lanes (log2(0), 0/0 on padding rows)
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:triton.runtime.interpreter")
