"""Side-by-side attention benchmark: sageattention vs torch SDPA (flash and cuDNN backends), one process.

    python -m sageattention.bench.run            # full protocol, writes bench/results/<gpu_dir>/fa3.{json,md,png}
    python -m sageattention.bench.run --quick    # a few shapes, writes .../fa3_quick.*

Times are medians of CUDA-event timings (triton.testing.do_bench, L2 flushed between runs).
TOPS = 4 * B * H * N^2 * D / t, halved for causal. "sage e2e" includes quantization;
"sage kernel" times the attention kernel alone on pre-quantized inputs.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
from torch.nn.attention import SDPBackend

import sageattention
from sageattention import dispatch, forward
from sageattention.bench.results import add_output_args, document, pyplot, run_meta, save_chart, stem, write_results
from sageattention.bench.workloads import attention_tops, pinned, sageattn_on_triton, sdpa_call
from sageattention.compiled_call import CompiledCall, Granularity, PvAccum
from sageattention.core import sageattn_plan
from sageattention.plan import Plan
from sageattention.triton import attention, pipeline

SUITES = ("fa3", "b4h32")


def fa3_shape(n: int, d: int, causal: bool) -> dict:
    """FA3-paper protocol: 16k tokens per batch (at least one sequence), heads * head_dim = 2048."""
    return dict(b=max(1, 16384 // n), h=2048 // d, n=n, d=d, causal=causal)


def fa3_shapes(quick: bool):
    ns = (1024, 4096, 16384) if quick else (1024, 2048, 4096, 8192, 16384)
    for d in (128, 64):
        for causal in (False, True):
            for n in ns:
                yield dict(suite="fa3", **fa3_shape(n, d, causal))


def long_shapes(quick: bool):
    ns = (8192, 32768) if quick else (1024, 2048, 4096, 8192, 16384, 32768)
    for n in ns:
        yield dict(suite="b4h32", b=4, h=32, n=n, d=128, causal=False)


TITLE = "Attention throughput: sageattention against SDPA"


def compiled_call(family: str, q, k, v, causal: bool):
    """A compiled module's fused op (HND, per-thread scales, two-level fp32 P·V accumulation), called directly: how
    the sm90 wgmma kernel is timed before dispatch uses it. Calling it raises where this build lacks the module."""
    def call():
        mod = dispatch.compiled_module(family)
        if mod is None or not mod.runs_on_current_device():
            raise RuntimeError(f"sageattention._C_{family} is not built for this GPU")
        return forward.compiled(q, k, v, CompiledCall(family, False, causal, 0, q.shape[-1] ** -0.5,
                                                      Granularity.PER_THREAD, PvAccum.ACC_TWO_LEVEL, True, False,
                                                      False))

    return call


def methods(q, k, v, causal: bool, plan: Plan):
    qb, kb, vb = (t.to(torch.bfloat16) for t in (q, k, v))
    xq = pipeline.quantize(q, k, v, plan)
    out = torch.empty_like(q)
    sm_scale = q.shape[-1] ** -0.5
    return {
        "sage e2e": lambda: sageattention.sageattn(q, k, v, is_causal=causal),
        "sage triton e2e": lambda: sageattn_on_triton(q, k, v, is_causal=causal),
        "sage kernel": lambda: pipeline.attend(xq, plan, out, sm_scale=sm_scale, is_causal=causal),
        "sage per-thread e2e": lambda: sageattention.sageattn(q, k, v, is_causal=causal, qk_quant_gran="per_thread"),
        "sage fp16-PV e2e": lambda: sageattention.sageattn_qk_int8_pv_fp16_triton(q, k, v, is_causal=causal),
        "sm89 mma.sync e2e": compiled_call("sm89", q, k, v, causal),
        "sm90 wgmma e2e": compiled_call("sm90", q, k, v, causal),
        "sdpa flash bf16": sdpa_call(SDPBackend.FLASH_ATTENTION, qb, kb, vb, is_causal=causal),
        "sdpa cudnn bf16": sdpa_call(SDPBackend.CUDNN_ATTENTION, qb, kb, vb, is_causal=causal),
    }


def tops(shape, ms: float) -> float:
    return attention_tops(shape["b"], shape["h"], shape["n"], shape["n"], shape["d"], shape["causal"], ms)


def median_ms(fn, label: str) -> float | None:
    """Median CUDA-event time of fn (L2 flushed between runs); None, with the error's first line on stderr, when
    the method does not take the shape."""
    try:
        with pinned(fn):
            return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    except Exception as e:  # a backend's refusal: RuntimeError, ValueError, NotImplementedError, ...
        print(f"{label}: {type(e).__name__}: {e}".splitlines()[0], file=sys.stderr)
        return None


def output_on_gpu(module: str, doc: str, suite: str, argv) -> tuple[Path, str] | None:
    """(--out, --name) of a benchmark module that takes no other option; None, having said why, without a CUDA GPU
    (the caller returns 2)."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.splitlines()[0])
    add_output_args(parser, suite)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"{module} needs a CUDA GPU", file=sys.stderr)
        return None
    return args.out, args.name or suite


def shapes(quick: bool, suites) -> list[dict]:
    return [s for gen in (fa3_shapes, long_shapes) for s in gen(quick) if s["suite"] in suites]


def run(quick: bool, suites, only=None) -> list[dict]:
    plan = sageattn_plan(torch.cuda.get_device_capability())
    rows = []
    for shape in shapes(quick, suites):
        torch.manual_seed(0)
        q, k, v = (torch.randn(shape["b"], shape["h"], shape["n"], shape["d"], device="cuda", dtype=torch.float16)
                   for _ in range(3))
        row = dict(shape)
        for name, fn in methods(q, k, v, shape["causal"], plan).items():
            if only and name not in only:
                continue
            ms = median_ms(fn, f"{name} {shape}")
            row[name] = None if ms is None else round(tops(shape, ms), 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    return rows


SHAPE_KEYS = ("suite", "b", "h", "n", "d", "causal")


def method_names(rows) -> list[str]:
    return [n for n in rows[0] if n not in SHAPE_KEYS]


def body(result: dict) -> str:
    """TOPS per shape and method."""
    rows = result["rows"]
    names = method_names(rows)
    text = "| shape | " + " | ".join(names) + " |\n|---|" + "---:|" * len(names) + "\n"
    for r in rows:
        label = f"{r['suite']} B={r['b']} H={r['h']} N={r['n']} d{r['d']}{' causal' if r['causal'] else ''}"
        text += f"| {label} | " + " | ".join("—" if r[n] is None else f"{r[n]:.0f}" for n in names) + " |\n"
    return text


def chart(rows, names, path: Path, meta: dict) -> None:
    plt = pyplot()
    groups = sorted({(r["suite"], r["d"], r["causal"]) for r in rows})
    fig, axes = plt.subplots(1, len(groups), figsize=(4.5 * len(groups), 4), squeeze=False)
    for ax, (suite, d, causal) in zip(axes[0], groups):
        sel = [r for r in rows if (r["suite"], r["d"], r["causal"]) == (suite, d, causal)]
        xs = [r["n"] for r in sel]
        for n in names:
            ax.plot(xs, [r[n] or 0 for r in sel], marker="o", label=n)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{suite} d{d}{' causal' if causal else ''}")
        ax.set_xlabel("sequence length")
        ax.set_ylabel("TOPS")
    axes[0][0].legend(fontsize=7)
    save_chart(fig, path, meta)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sageattention.bench.run", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few shapes only")
    ap.add_argument("--suite", action="append", choices=SUITES, help="default: both (their rows share one file)")
    add_output_args(ap, "fa3, or b4h32 without fa3; then _quick with --quick")
    ap.add_argument("--methods", help="comma-separated columns to time (default: all), e.g. 'sage e2e,sdpa cudnn bf16'")
    ap.add_argument("--two-step", action="store_true",
                    help="the kernel's two-step exponent everywhere (the before of the one-FMA exponent, for A/B runs)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("sageattention.bench.run needs a CUDA GPU", file=sys.stderr)
        return 2
    attention.ONE_FMA = not args.two_step
    suites = set(args.suite or SUITES)
    meta = run_meta("sageattention.bench.run", argv)
    rows = run(args.quick, suites, args.methods and args.methods.split(","))
    result = dict(meta=meta, rows=rows)
    name = args.name or ("fa3" if "fa3" in suites else "b4h32") + ("_quick" if args.quick else "")
    path = stem(args.out, meta, name)
    write_results(path, meta, rows, document(TITLE, result, body(result)))
    chart(rows, method_names(rows), path.with_suffix(".png"), meta)
    print(body(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
