"""Run in a child process with TRITON_INTERPRET=1: the Triton kernel on CPU vs the reference.

Triton reads TRITON_INTERPRET when a kernel is decorated, so this cannot share a process with
tests that import the kernels compiled. Prints one JSON line of metrics per case.
"""
import json
import math
import sys

import torch

from sage3_metrics import cosine, poisoned_empty, rel_l1
from sageattn3 import triton_attn
from sageattn3.prepare import quantize_inputs
from sageattn3.reference import attention_reference


def main(cases):
    triton_attn.torch.empty = poisoned_empty
    for case in cases:
        b, h, h_kv, n_q, n_k, d = case["shape"]
        g = torch.Generator().manual_seed(case["seed"])
        q, k, v = (torch.randn(b, heads, n, d, generator=g) for heads, n in ((h, n_q), (h_kv, n_k), (h_kv, n_k)))
        qi = quantize_inputs(q, k, v, case["per_block_mean"])
        scale = 1 / math.sqrt(d)
        ref, ref_lse = attention_reference(qi, case["causal"], scale)
        out, lse = triton_attn.attention_triton(qi, case["causal"], scale, native=case["native"])
        print(json.dumps(dict(case, cos=cosine(out, ref), rel_l1=rel_l1(out, ref),
                              lse_err=(lse - ref_lse).abs().max().item(), finite=bool(out.isfinite().all()))))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
