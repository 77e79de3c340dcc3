"""The Triton kernel run by the CPU interpreter (TRITON_INTERPRET=1) against the PyTorch reference."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from packaging.version import Version

from sage3_cases import CASES, EXTREMES, check

triton = pytest.importorskip("triton")

HERE = Path(__file__).parent
RUNS = [dict(c, native=native) for c in CASES for native in (True, False)] + [dict(c, native=True) for c in EXTREMES]


@pytest.fixture(scope="module")
def interpreted():
    if Version(np.__version__) >= Version("2.4") and Version(triton.__version__) < Version("3.7"):
        pytest.skip(f"Triton {triton.__version__}'s interpreter fails on NumPy {np.__version__} (triton-lang/triton#9171: "
                    "it converts 1-element arrays to scalars); the test extra pins numpy<2.4")
    cases = [dict(c, seed=i) for i, c in enumerate(RUNS)]
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, str(HERE / "sage3_interpreted.py"), json.dumps(cases)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    return [json.loads(line) for line in run.stdout.splitlines()]


@pytest.mark.parametrize("index", range(len(RUNS)))
def test_triton_interpreter_matches_reference(interpreted, index):
    r = interpreted[index]
    print(f"triton vs reference {RUNS[index]}: cos={r['cos']:.6f} relL1={r['rel_l1']:.4f} lse_err={r['lse_err']:.2e}")
    check(r)
