"""Where does the end-to-end time go? CPU time per call vs GPU time per kernel, for a few shapes.

    python -m sageattention.bench.profile                 # sageattn
    python -m sageattention.bench.profile --family sm90   # a compiled module's fused op, called directly
                                                          # (quantization + attention)

Under `ncu` the same command profiles one kernel, e.g. the sm90 attention kernel's tensor-pipe use and stalls:
    ncu --set full -k regex:attention_sm90 -c 1 python -m sageattention.bench.profile --family sm90
"""
import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

import sageattention
from sageattention.bench.results import provenance, run_meta
from sageattention.bench.run import compiled_call

SHAPES = [(16, 16, 1024, 128), (4, 16, 4096, 128), (1, 16, 16384, 128), (16, 32, 1024, 64)]


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m sageattention.bench.profile", description=__doc__.splitlines()[0])
    ap.add_argument("--family", help="time sageattention._C_<family>'s op (e.g. sm89, sm90) instead of sageattn")
    args = ap.parse_args(argv)
    print(provenance(run_meta("sageattention.bench.profile", argv)))
    for b, h, n, d in SHAPES:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
        call = compiled_call(args.family, q, k, v, False) if args.family else lambda: sageattention.sageattn(q, k, v)
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            call()
        cpu_ms = (time.perf_counter() - t0) / 20 * 1e3  # launches only: no sync inside the loop
        torch.cuda.synchronize()
        gpu_ms = (time.perf_counter() - t0) / 20 * 1e3
        print(f"B{b} H{h} N{n} d{d}: CPU {cpu_ms:.3f} ms/call to launch, wall {gpu_ms:.3f} ms/call")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                call()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))


if __name__ == "__main__":
    main()
