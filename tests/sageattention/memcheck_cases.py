"""Small odd shapes through the compiled modules (one with more 128-row items than an H100/H200 has SMs, so the sm90
kernel's persistent programs run several each), and packed varlen batches through the Triton kernels, for
`compute-sanitizer --tool memcheck` (test_cuda_kernels.py).

    compute-sanitizer --tool memcheck python tests/sageattention/memcheck_cases.py
"""
import importlib.util
import itertools

import torch

from sageattention import dispatch

CASES = [  # (b, hq, hk, nq, nk, d, causal, nhd)
    (1, 1, 1, 1, 1, 64, False, False), (1, 2, 1, 17, 77, 64, True, True), (2, 2, 2, 77, 17, 80, False, False),
    (1, 4, 2, 129, 65, 128, True, False), (1, 1, 1, 200, 300, 60, False, True), (2, 70, 35, 300, 130, 64, False, False),
]

VARLEN_CASES = [  # (q lengths, k lengths, causal): odd lengths, a sequence with no tokens, one with no keys
    ([1, 17, 0, 77], [5, 0, 9, 130], True), ([33, 1, 64], [33, 1, 65], False),
]


def varlen_cases() -> None:
    import sageattention as sa
    for lens_q, lens_k, causal in VARLEN_CASES:
        q = torch.randn(sum(lens_q), 4, 80, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(sum(lens_k), 2, 80, device="cuda", dtype=torch.float16) for _ in range(2))
        starts = [0, *itertools.accumulate(lens_q)]
        cu_q, cu_k = (torch.tensor([0, *itertools.accumulate(n)], dtype=torch.int32, device="cuda")
                      for n in (lens_q, lens_k))
        out = sa.sageattn_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), is_causal=causal)
        assert torch.isfinite(out).all()
        assert all(not out[starts[i]:starts[i + 1]].any() for i, n in enumerate(lens_k) if n == 0)  # no keys: 0


def main() -> None:
    for family in ("sm80", "sm89", "sm90"):
        mod = dispatch.compiled_module(family)
        if mod is None:  # sm90 is built only when the arch list names 9.0
            continue
        if not mod.runs_on_current_device():
            continue
        print(f"memcheck family {family}")  # the test checks that every family built for this GPU ran
        for b, hq, hk, nq, nk, d, causal, nhd in CASES:
            shape = (lambda h, n: (b, n, h, d)) if nhd else (lambda h, n: (b, h, n, d))
            q = torch.randn(shape(hq, nq), device="cuda", dtype=torch.float16)
            k, v = (torch.randn(shape(hk, nk), device="cuda", dtype=torch.float16) for _ in range(2))
            for accum in (0, 1, 2):
                out, lse = mod.attention(q, k, v, nhd, causal, nk - nq, d**-0.5, 2, accum, True, accum == 1, True)
                assert torch.isfinite(out).all()
    if importlib.util.find_spec("triton") is not None:  # sageattn_varlen runs on Triton
        varlen_cases()
    torch.cuda.synchronize()
    print("memcheck cases done")


if __name__ == "__main__":
    main()
