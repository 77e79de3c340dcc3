"""The Triton kernel run by the CPU interpreter (TRITON_INTERPRET=1) against the PyTorch reference."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
CASES = [
    dict(shape=(1, 2, 2, 128, 192, 128), causal=False, per_block_mean=True),
    dict(shape=(1, 4, 2, 130, 100, 64), causal=True, per_block_mean=True),    # GQA, ragged lengths
    dict(shape=(2, 1, 1, 256, 256, 64), causal=True, per_block_mean=False),   # two query tiles
]


@pytest.fixture(scope="module")
def interpreted():
    cases = [dict(c, native=native, seed=i) for i, c in enumerate(CASES) for native in (True, False)]
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, str(HERE / "sage3_interpreted.py"), json.dumps(cases)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    return [json.loads(line) for line in run.stdout.splitlines()]


@pytest.mark.parametrize("index", range(2 * len(CASES)))
def test_triton_interpreter_matches_reference(interpreted, index):
    r = interpreted[index]
    print(f"triton (native={r['native']}) vs reference {r['shape']} causal={r['causal']}: "
          f"cos={r['cos']:.6f} relL1={r['rel_l1']:.4f} lse_err={r['lse_err']:.2e}")
    # Not bit-equal: float32 sums in another order flip a few FP4 roundings of P. A layout or
    # scale bug gives a cosine near 0, not 0.999.
    assert r["finite"]
    assert r["cos"] >= 0.999 and r["rel_l1"] <= 0.02 and r["lse_err"] <= 1e-4
