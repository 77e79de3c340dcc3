"""Run in a child process with TRITON_INTERPRET=1: the Triton kernel on CPU vs the reference.

Triton reads TRITON_INTERPRET when a kernel is decorated, so this cannot share a process with
tests that import the kernels compiled. Prints one JSON line of metrics per case.
"""
import json
import sys

from sage3_cases import case_args, case_inputs, compare
from sage3_metrics import poisoned_empty
from sageattn3 import triton_attn
from sageattn3.prepare import quantize_inputs
from sageattn3.reference import attention_reference


def main(cases):
    triton_attn.torch.empty = poisoned_empty
    for case in cases:
        qi = quantize_inputs(*case_inputs(case, case["seed"]), case.get("per_block_mean", True))
        ref, ref_lse = attention_reference(qi, *case_args(case))
        out, lse = triton_attn.attention_triton(qi, *case_args(case), native=case["native"])
        print(json.dumps(dict(case, **compare(out, lse, ref, ref_lse))))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
