"""Host time of one `sageattn` call, by stage: where a small call's microseconds go.

    python -m bench.host [--models sdxl-cross,small] [--calls 2000]

For each model shape, microseconds per call in a back-to-back loop (the GPU catches up at the end; short calls are
host-bound, so this is the host's time): SDPA as a model calls it, `sageattn`, its checks and routing alone
(`explain`), and the kernel call it routes to alone (SDPA fallback or the compiled op); then cProfile's top entries
for `sageattn`.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys

import torch

import sageattention as sa
from bench.models import back_to_back_ms, name_list
from bench.workloads import MODELS, inputs, sdpa_call
from sageattention import core, fallback, ops


def routed_kernel(q, k, v, layout: str, causal: bool):
    """The call `sageattn` ends in for these inputs, with everything before it done once."""
    backend, detail = core._sageattn(q, k, v, layout, causal, None, False, {}, explain=True)
    scale = q.shape[-1] ** -0.5
    if backend == "sdpa":
        return backend, lambda: fallback.sdpa(q, k, v, layout, causal, 0, scale)
    if backend == "compiled":
        args = (q, k, v, layout == "NHD", causal, 0, scale, detail, core.GRAN_CODE[core.SAGEATTN_GRAN_COMPILED],
                core.compiled_accum(core.sageattn_plan(torch.cuda.get_device_capability())), True, False, False)
        return f"compiled {detail}", lambda: ops.run_compiled_attention(*args)
    return backend, None


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
        gqa = dict(enable_gqa=True) if m.hk != m.hq else {}
        backend, kernel = routed_kernel(q, k, v, m.layout, m.causal)
        stages = {
            "sdpa (as a model calls it)": sdpa_call(None, q, k, v, m.layout, is_causal=m.causal, **gqa),
            "sageattn": lambda: sa.sageattn(q, k, v, tensor_layout=m.layout, is_causal=m.causal),
            "checks and routing (explain)": lambda: sa.explain(q, k, v, tensor_layout=m.layout, is_causal=m.causal),
        }
        if kernel is not None:
            stages[f"{backend} call alone"] = kernel
        print(f"\n{m.label} ({m.shape()}): sageattn runs {backend}")
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
