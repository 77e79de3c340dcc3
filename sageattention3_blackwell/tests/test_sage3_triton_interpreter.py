"""The Triton kernel run by the CPU interpreter (TRITON_INTERPRET=1) against the PyTorch reference."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sage3_cases import CASES, EXTREMES, check

HERE = Path(__file__).parent
RUNS = [dict(c, native=native) for c in CASES for native in (True, False)] + [dict(c, native=True) for c in EXTREMES]


@pytest.fixture(scope="module")
def interpreted():
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
