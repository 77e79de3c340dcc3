"""Compile the kernels of the benchmark's shapes in parallel processes before timing them.

    python -m sageattention.bench.warm [--quick] [--suite fa3] [--jobs 16]   # run's options; then run it

The autotuner compiles every config of a new shape key, ~15 s of CPU each, one at a time in the timing
process. Here each worker process runs sageattn's Triton path once on one (N, d, causal, heads) key with batch 1
(the head count is a compile-time constant), and Triton's on-disk cache hands the binaries to the benchmark.
The Triton path is called by name: where compiled kernels serve the GPU, a plain sageattn call compiles nothing.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import time

from sageattention.bench.run import SUITES, shapes


def _compile(key) -> str:
    import torch

    from sageattention.bench.workloads import sageattn_on_triton

    n, d, causal, h = key
    q, k, v = (torch.randn(1, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
    sageattn_on_triton(q, k, v, is_causal=causal)
    torch.cuda.synchronize()
    return f"N={n} d{d} H={h}{' causal' if causal else ''}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sageattention.bench.warm", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the shapes of run --quick")
    ap.add_argument("--suite", action="append", choices=SUITES, help="default: both")
    ap.add_argument("--jobs", type=int, default=mp.cpu_count())
    args = ap.parse_args(argv)
    keys = sorted({(s["n"], s["d"], s["causal"], s["h"]) for s in shapes(args.quick, set(args.suite or SUITES))})
    start = time.perf_counter()
    with mp.get_context("spawn").Pool(min(args.jobs, len(keys))) as pool:
        for done in pool.imap_unordered(_compile, keys):
            print(f"compiled {done} ({time.perf_counter() - start:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
