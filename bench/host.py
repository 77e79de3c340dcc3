"""Host time of one `sageattn` call, by stage: where a small call's microseconds go.

    python -m bench.host [--models sdxl-cross,small] [--calls 2000]

For each model shape, microseconds per call in a back-to-back loop (the GPU catches up at the end; short calls are
host-bound, so this is the host's time): SDPA as a model calls it, `sageattn`, its checks and routing alone
(`explain`), and the kernel call it routes to alone (SDPA fallback or the compiled op); then cProfile's top entries
for `sageattn`.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import sys
from unittest import mock

import torch

import sageattention as sa
from bench.models import back_to_back_ms, name_list
from bench.workloads import MODELS, inputs, model_sdpa
from sageattention import fallback, ops


# The calls a `sageattn` call ends in (core reaches each through its module's attribute).
ROUTES = ((fallback, "sdpa"), (ops, "run_compiled_attention"), (ops, "run_attention"))


def routed_kernel(q, k, v, layout: str, causal: bool):
    """(route, call): the call that one `sageattn` call ends in, recorded with its arguments, to time it alone."""
    seen = []
    with contextlib.ExitStack() as stack:
        for owner, name in ROUTES:
            real = getattr(owner, name)
            stack.enter_context(mock.patch.object(owner, name, lambda *a, real=real: seen.append((real, a)) or real(*a)))
        sa.sageattn(q, k, v, tensor_layout=layout, is_causal=causal)
    (real, args), = seen
    return sa.explain(q, k, v, tensor_layout=layout, is_causal=causal), lambda: real(*args)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.host", description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=name_list(MODELS), default=["sdxl-cross", "small"])
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.host needs a CUDA GPU", file=sys.stderr)
        return 2
    for key in args.models:
        m = MODELS[key]
        q, k, v = inputs(m)
        route, kernel = routed_kernel(q, k, v, m.layout, m.causal)
        stages = {
            "sdpa (as a model calls it)": model_sdpa(m, q, k, v),
            "sageattn": lambda: sa.sageattn(q, k, v, tensor_layout=m.layout, is_causal=m.causal),
            "checks and routing (explain)": lambda: sa.explain(q, k, v, tensor_layout=m.layout, is_causal=m.causal),
            "the routed call alone": kernel,
        }
        print(f"\n{m.label} ({m.shape()}): sageattn runs {route}")
        for name, fn in stages.items():
            print(f"  {name:40s} {back_to_back_ms(fn, args.calls) * 1e3:8.1f} µs/call")
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            sa.sageattn(q, k, v, tensor_layout=m.layout, is_causal=m.causal)
        prof.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(14)
        print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[-2200:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
