"""Host time of one `sageattn` call, by stage: where a small call's microseconds go.

    python -m sageattention.bench.host [--models sdxl-cross,small] [--calls 2000]

For each model shape and stage (SDPA as a model calls it, `sageattn`, its checks and routing alone (`explain`), and
the kernel call it routes to alone: SDPA fallback or the compiled op), microseconds per call three ways:
- back to back: a loop, the GPU caught up at its end (what a model that only calls attention feels);
- host: the same loop timed before the GPU catches up (short enough not to fill the launch queue);
- GPU: the kernels' own time per call (torch.profiler), kernel by kernel for sageattn.
A call whose back-to-back time is its host time is host-bound. Then cProfile's top entries for `sageattn`.
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
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import sageattention as sa
from sageattention.bench.models import back_to_back_ms, name_list
from sageattention.bench.results import provenance, run_meta
from sageattention.bench.workloads import MODELS, inputs, model_sdpa
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


def profiled(fn, calls: int = 50) -> tuple[dict, dict]:
    """torch.profiler over `calls` calls: ({kernel: GPU µs per call}, {ATen op or CUDA runtime call: host µs per
    call})."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    events = prof.key_averages()
    # kernels only on the GPU side: an op that launched a kernel carries that kernel's time too
    kernels = {e.key: e.self_device_time_total / calls for e in events
               if e.device_type == DeviceType.CUDA and e.self_device_time_total > 0}
    return kernels, {e.key: e.self_cpu_time_total / calls for e in events if e.self_cpu_time_total > 0}


def print_top(title: str, times: dict, n: int = 12) -> None:
    print(f"    {title}:")
    for name, us in sorted(times.items(), key=lambda kv: -kv[1])[:n]:
        print(f"      {us:8.2f}  {name[:90]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sageattention.bench.host", description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=name_list(MODELS), default=["sdxl-cross", "small"])
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("sageattention.bench.host needs a CUDA GPU", file=sys.stderr)
        return 2
    print(provenance(run_meta("sageattention.bench.host", argv)))
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
        print(f"  {'µs per call':40s} {'back to back':>12s} {'host':>8s} {'GPU':>8s}")
        for name, fn in stages.items():
            kernels, host = profiled(fn)
            # host alone: 100 calls of about 3 launches each stay within the launch queue
            print(f"  {name:40s} {back_to_back_ms(fn, args.calls) * 1e3:12.1f} "
                  f"{back_to_back_ms(fn, 100, wait=False) * 1e3:8.1f} {sum(kernels.values()):8.1f}")
            if name == "the routed call alone":  # under the profiler, which adds its own time to each entry
                print_top("GPU µs per call by kernel", kernels)
                print_top("host µs per call by op and CUDA runtime call", host)
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
