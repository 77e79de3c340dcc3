"""Small odd shapes through both compiled modules, for `compute-sanitizer --tool memcheck` (test_cuda_kernels.py).

    compute-sanitizer --tool memcheck python tests/sageattention/memcheck_cases.py
"""
import importlib

import torch

CASES = [  # (b, hq, hk, nq, nk, d, causal, nhd)
    (1, 1, 1, 1, 1, 64, False, False), (1, 2, 1, 17, 77, 64, True, True), (2, 2, 2, 77, 17, 80, False, False),
    (1, 4, 2, 129, 65, 128, True, False), (1, 1, 1, 200, 300, 60, False, True),
]


def main() -> None:
    for family in ("sm80", "sm89"):
        mod = importlib.import_module(f"sageattention._C_{family}")
        if not mod.runs_on_current_device():
            continue
        for b, hq, hk, nq, nk, d, causal, nhd in CASES:
            shape = (lambda h, n: (b, n, h, d)) if nhd else (lambda h, n: (b, h, n, d))
            q = torch.randn(shape(hq, nq), device="cuda", dtype=torch.float16)
            k, v = (torch.randn(shape(hk, nk), device="cuda", dtype=torch.float16) for _ in range(2))
            for accum in (0, 1, 2):
                out, lse = mod.attention(q, k, v, nhd, causal, nk - nq, d**-0.5, 2, 2, accum, True, accum == 1, True)
                assert torch.isfinite(out).all()
    torch.cuda.synchronize()
    print("memcheck cases done")


if __name__ == "__main__":
    main()
