"""Where does sageattn's end-to-end time go? CPU time per call vs GPU time per kernel, for a few shapes.

    python -m bench.profile
"""
import time

import torch
from torch.profiler import ProfilerActivity, profile

import sageattention


def main():
    for b, h, n, d in [(16, 16, 1024, 128), (4, 16, 4096, 128)]:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
        for _ in range(3):
            sageattention.sageattn(q, k, v)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            sageattention.sageattn(q, k, v)
        cpu_ms = (time.perf_counter() - t0) / 20 * 1e3  # launches only: no sync inside the loop
        torch.cuda.synchronize()
        gpu_ms = (time.perf_counter() - t0) / 20 * 1e3
        print(f"B{b} H{h} N{n} d{d}: CPU {cpu_ms:.3f} ms/call to launch, wall {gpu_ms:.3f} ms/call")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                sageattention.sageattn(q, k, v)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))


if __name__ == "__main__":
    main()
