"""Real-model attention benchmark: what users feel on the shapes of Flux, SDXL, CogVideoX, Wan2.1 and a GQA LLM.

    python -m sageattention.bench.models                          # TOPS and back-to-back ms/call (a few minutes)
    python -m sageattention.bench.models --first-call --spread 3  # plus fresh-process first calls, over 3 processes
    python -m sageattention.bench.models --models flux,small --methods "sdpa cudnn,sageattn"

Shapes and methods: sageattention/bench/workloads.py. One process times every method on the same inputs:
- TOPS: 4·B·Hq·Nq·Nk·D / t (halved for causal), t the median of CUDA-event timings with L2 flushed (do_bench).
- ms/call: wall clock over back-to-back calls after warm-up, one synchronize at the end of each loop, the median of
  5 loops; shows host overhead.
- --first-call: for each model and method a fresh process (sageattention.bench.first_call) times its first call up to
  synchronize, and `import torch` / `import sageattention` apart.
- --spread N: N separate processes time every method again; (max/min − 1) of their medians, in % (each process's
  median in the JSON: spread_ms).
Before timing, fresh processes run every sageattention method once in parallel so that Triton's on-disk cache holds
the kernels (--no-warm: skip); first calls are therefore cached ones unless --fresh-cache.
Writes <out>/<gpu_dir>/models.{json,md,png} (--name: another file name, e.g. for a run in another order). Accuracy
is sageattention.bench.accuracy's job.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

import sageattention
from sageattention.bench.results import add_output_args, document, pyplot, run_meta, save_chart, stem, write_results
from sageattention.bench.run import median_ms
from sageattention.bench.workloads import METHODS, MODELS, SAGE_FUNCTIONS, Model, inputs, methods, pinned

# Where child processes run: the directory `sageattention` is imported from, so that they import the same code.
ROOT = Path(sageattention.__file__).resolve().parents[1]
TITLE = "Real-model attention benchmark"
TABLES = {  # row key -> (title, number format)
    "tops": ("TOPS (median; higher is better)", "{:.0f}"),
    "ms_per_call": ("ms per call, back to back (host overhead included)", "{:.3f}"),
    "first_call_s": ("first call of the shape in a fresh process, s", "{:.2f}"),
    "spread_pct": ("median time across separate processes: max/min − 1, %", "{:.1f}"),
}


def back_to_back_ms(fn, calls: int, repeats: int = 5, wait: bool = True) -> float:
    """ms per call of `calls` calls back to back: the median of `repeats` loops, so that one hiccup of the host does
    not move it. wait: each loop's time includes the GPU catching up at its end; else it stops before, which is the
    host's time alone (for loops short enough not to fill the launch queue)."""
    per_call = []
    with pinned(fn):
        fn()
        for _ in range(repeats):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            if wait:
                torch.cuda.synchronize()
            per_call.append((time.perf_counter() - start) * 1e3 / calls)
        torch.cuda.synchronize()
    return statistics.median(per_call)


def sageattn_path(m: Model, qkv) -> str:
    """Which kernels a plain sageattn call runs on m's inputs (SDPA below a size or, on some GPUs, a length)."""
    return sageattention.explain(*qkv, tensor_layout=m.layout, is_causal=m.causal)


def measure(m: Model, names, calls: int, notes: dict) -> dict:
    """Median ms and TOPS of each method on m's shape, and (calls > 0) its back-to-back ms/call; None where a method
    raises. The first warning of each method (e.g. a `_cuda` variant running on Triton) goes to notes."""
    qkv = inputs(m)
    fns = methods(m, *qkv)
    row = dict(model=m.key, label=m.label, shape=m.shape(), sageattn_path=sageattn_path(m, qkv), median_ms={},
               tops={})
    for name in names:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ms = median_ms(fns[name], f"{name} on {m.key}")
        if caught:
            notes.setdefault(name, str(caught[0].message).splitlines()[0])
        row["median_ms"][name] = None if ms is None else round(ms, 4)
        row["tops"][name] = None if ms is None else round(m.tops(ms), 1)
        if calls and ms is not None:
            # About 0.2 s of GPU work per loop at most: long calls are GPU-bound, and host overhead only shows on
            # short ones.
            loop = back_to_back_ms(fns[name], min(calls, max(10, int(200 / ms))))
            row.setdefault("ms_per_call", {})[name] = round(loop, 4)
    return row


def child_json(cmd: list[str], env=None, timeout: int = 900) -> list[dict] | None:
    """The JSON lines a child process prints; None, with the last line of its stderr, when it fails."""
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"{' '.join(cmd[1:])}: timed out after {timeout} s", file=sys.stderr)
        return None
    if done.returncode:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        print(f"{' '.join(cmd[1:])}: {last}", file=sys.stderr)
        return None
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def first_call_cmd(m: Model, method: str) -> list[str]:
    return [sys.executable, "-m", "sageattention.bench.first_call", m.key, method]


def warm(models, names, jobs: int) -> None:
    """Compile the sageattention methods' Triton kernels for these shapes in parallel processes (on-disk cache)."""
    cmds = [first_call_cmd(m, n) for m in models for n in names if n in SAGE_FUNCTIONS]
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(child_json, cmds))


def first_calls(m: Model, names, fresh_cache: bool) -> dict:
    """first_call_s and imports_s of each method, each from its own fresh process."""
    out = dict(first_call_s={}, imports_s={})
    for name in names:
        with tempfile.TemporaryDirectory(prefix="bench-triton-cache-") as cache:
            env = dict(os.environ, TRITON_CACHE_DIR=cache) if fresh_cache else None
            got = (child_json(first_call_cmd(m, name), env) or [None])[0]
        out["first_call_s"][name] = got and round(got["first_call_s"], 3)
        out["imports_s"][name] = got and {k: round(v, 3) for k, v in got.items() if k.startswith("import_")}
    return out


def spread_pct(values: list, procs: int) -> float | None:
    if len(values) < procs or None in values:
        return None
    return round((max(values) / min(values) - 1) * 100, 1)


def process_medians(models, names, procs: int) -> dict:
    """model key -> method -> the median ms in each of `procs` separate processes, in order (None where one failed):
    kept beside the spread, so that an outlier process shows."""
    cmd = [sys.executable, "-m", "sageattention.bench.models", "--medians", "--models", ",".join(m.key for m in models),
           "--methods", ",".join(names)]
    runs = [{r["model"]: r["median_ms"] for r in child_json(cmd) or []} for _ in range(procs)]
    return {m.key: {n: [run.get(m.key, {}).get(n) for run in runs] for n in names} for m in models}


def body(result: dict) -> str:
    """A table per measured quantity, then imports, routes and warnings."""
    rows, meta = result["rows"], result["meta"]
    names = list(rows[0]["tops"])
    text = ""
    for key, (title, fmt) in TABLES.items():
        if not any(key in r for r in rows):
            continue
        text += f"\n**{title}**\n\n| model | shape | " + " | ".join(names) + " |\n"
        text += "|---|---|" + "---:|" * len(names) + "\n"
        for r in rows:
            cells = (r.get(key, {}).get(n) for n in names)
            text += f"| {r['label']} | {r['shape']} | " + " | ".join(
                "—" if c is None else fmt.format(c) for c in cells) + " |\n"
    imports = [i for r in rows for i in r.get("imports_s", {}).values() if i]
    if imports:
        ranges = {k.removeprefix("import_").removesuffix("_s"): [i[k] for i in imports] for k in imports[0]}
        text += "\nImports in the fresh processes: " + ", ".join(
            f"{what} {min(ts):.2f}–{max(ts):.2f} s" for what, ts in ranges.items()) + "\n"
    paths = [r for r in rows if r.get("sageattn_path")]
    if paths:
        text += "\nWhat a plain `sageattn` call runs:\n" + "".join(f"- {r['label']}: {r['sageattn_path']}\n"
                                                                  for r in paths)
    if meta.get("notes"):
        text += "\nWarnings (first call of each method):\n" + "".join(f"- {n}: {w}\n" for n, w in meta["notes"].items())
    return text.lstrip("\n")


def chart(rows, names, path: Path, meta: dict, key: str = "tops", ylabel: str = "TOPS") -> None:
    """Grouped bars: row[key][name] per row and method (accuracy charts its errors with it)."""
    plt = pyplot()
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(1.6 * len(rows) + 2, 4.5))
    for i, name in enumerate(names):
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(rows))]
        ax.bar(xs, [r[key][name] or 0 for r in rows], width, label=name)
    ax.set_xticks(range(len(rows)), [f"{r['label']}\n{textwrap.fill(r['shape'], 24)}" for r in rows], fontsize=7)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    save_chart(fig, path, meta)


def report(rows, meta: dict, names, path: Path) -> None:
    """path.{json,md,png}."""
    result = dict(meta=meta, rows=rows)
    write_results(path, meta, rows, document(TITLE, result, body(result)))
    chart(rows, names, path.with_suffix(".png"), meta)


def name_list(choices):
    """argparse type: comma-separated names, each one of choices."""
    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in choices]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"unknown {unknown or text!r}; supported: {', '.join(choices)}")
        return names
    return parse


def add_selection(ap: argparse.ArgumentParser, methods) -> None:
    """--models (of workloads.MODELS) and --methods, comma-separated, default all."""
    ap.add_argument("--models", type=name_list(MODELS), default=list(MODELS),
                    help=f"comma-separated, default all: {','.join(MODELS)}")
    ap.add_argument("--methods", type=name_list(methods), default=list(methods),
                    help=f"comma-separated, default all: {','.join(methods)}")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m sageattention.bench.models", description=__doc__.splitlines()[0])
    add_selection(ap, METHODS)
    ap.add_argument("--calls", type=int, default=500,
                    help="back-to-back calls per loop, median of 5 loops (fewer past 0.2 s of GPU work per loop)")
    ap.add_argument("--first-call", action="store_true", help="first call of each shape and method in a fresh process")
    ap.add_argument("--fresh-cache", action="store_true", help="--first-call with an empty Triton cache per process")
    ap.add_argument("--spread", type=int, default=0, metavar="N", help="spread of the medians over N processes (≥ 2)")
    ap.add_argument("--no-warm", action="store_true", help="skip compiling the Triton kernels in parallel first")
    ap.add_argument("--jobs", type=int, default=os.cpu_count(), help="parallel processes of the warm-up")
    add_output_args(ap, "models")
    ap.add_argument("--medians", action="store_true", help=argparse.SUPPRESS)  # a --spread child: JSON rows only
    args = ap.parse_args(argv)
    if args.calls < 1 or args.jobs < 1:
        ap.error("--calls and --jobs must be at least 1")
    if args.spread == 1 or args.spread < 0:
        ap.error(f"--spread {args.spread}: a spread needs at least 2 processes (or 0: none)")
    if args.fresh_cache and not args.first_call:
        ap.error("--fresh-cache applies to --first-call; add --first-call")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("sageattention.bench.models needs a CUDA GPU", file=sys.stderr)
        return 2
    models = [MODELS[k] for k in args.models]
    if args.medians:
        for m in models:
            print(json.dumps(measure(m, args.methods, 0, {})), flush=True)
        return 0
    if not args.no_warm:
        warm(models, args.methods, args.jobs)
    notes: dict = {}
    meta = dict(run_meta("sageattention.bench.models", argv), notes=notes)
    path = stem(args.out, meta, args.name or "models")
    rows = []
    for m in models:
        rows.append(measure(m, args.methods, args.calls, notes))
        if args.first_call:
            rows[-1].update(first_calls(m, args.methods, args.fresh_cache))
        print(json.dumps(rows[-1]), flush=True)
        report(rows, meta, args.methods, path)  # a run stopped by a time limit keeps what it measured
    if args.spread:
        for row, medians in zip(rows, process_medians(models, args.methods, args.spread).values()):
            row["spread_ms"] = medians
            row["spread_pct"] = {n: spread_pct(ms, args.spread) for n, ms in medians.items()}
        report(rows, meta, args.methods, path)
    print(body(dict(meta=meta, rows=rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
