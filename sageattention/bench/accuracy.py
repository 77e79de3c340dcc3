"""Accuracy on real-model shapes against fp32 SDPA, on random and on structured inputs, with its decomposition.

    python -m sageattention.bench.accuracy [--models flux,sdxl] [--out DIR]   # <gpu_dir>/accuracy.{json,md,png}

Structured inputs (workloads.inputs): keys shifted by a per-channel bias, a few outlier query channels.
The methods separate what each choice costs: Q/K granularity (per-thread, per-warp, per-block with FP8 P·V),
P·V precision (16-bit against FP8, with fp32 or fp16 per-tile accumulation), and the Triton path; "sdpa bf16" is
the error of unquantized 16-bit attention, the floor of any 16-bit kernel. sageattn's SDPA fallback is off here, so
that its rows are the quantized kernels' error on every shape (a plain call the fallback takes has SDPA's).
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import torch

import sageattention as sa
from sageattention.bench.models import add_selection, chart
from sageattention.bench.results import add_output_args, document, run_meta, stem, write_results
from sageattention.bench.workloads import MODELS, Model, inputs, model_sdpa, sageattn_on_triton
from sageattention.reference import error_metrics

METHODS = {
    "sageattn": lambda q, k, v, **kw: sa.sageattn(q, k, v, **kw),
    "sageattn per_warp": lambda q, k, v, **kw: sa.sageattn(q, k, v, qk_quant_gran="per_warp", **kw),
    "sageattn per_block": lambda q, k, v, **kw: sa.sageattn(q, k, v, qk_quant_gran="per_block", **kw),
    "sageattn triton": sageattn_on_triton,
    "fp16_cuda (16-bit P·V)": sa.sageattn_qk_int8_pv_fp16_cuda,
    "fp8_cuda fp32+fp32": lambda q, k, v, **kw: sa.sageattn_qk_int8_pv_fp8_cuda(q, k, v, pv_accum_dtype="fp32+fp32",
                                                                               **kw),
    "fp8_cuda fp32+fp16": lambda q, k, v, **kw: sa.sageattn_qk_int8_pv_fp8_cuda(q, k, v, pv_accum_dtype="fp32+fp16",
                                                                               **kw),
    "sdpa bf16": None,  # scaled_dot_product_attention on the inputs themselves
}


def metrics(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """reference.error_metrics, rounded for the tables (NaN where out has a non-finite value)."""
    if not torch.isfinite(out).all():
        return dict(cos=float("nan"), rel_l1=float("nan"))
    m = error_metrics(out, ref)
    return dict(cos=round(m["cos"], 6), rel_l1=round(m["rel_l1"], 5))


def measure(m: Model, names, structured: bool, notes: dict) -> dict:
    q, k, v = inputs(m, structured=structured)
    ref = model_sdpa(m, q.float(), k.float(), v.float())()
    row = dict(model=m.key, label=m.label, shape=m.shape(), inputs="structured" if structured else "random",
               cos={}, rel_l1={})
    for name in names:
        out = None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                out = model_sdpa(m, q, k, v)() if METHODS[name] is None else METHODS[name](
                    q, k, v, tensor_layout=m.layout, is_causal=m.causal)
            except Exception as e:  # a variant refusing the GPU or the shape: recorded, not fatal
                notes.setdefault(name, f"{type(e).__name__}: {e}".splitlines()[0])
        if caught:
            notes.setdefault(name, str(caught[0].message).splitlines()[0])
        got = dict(cos=None, rel_l1=None) if out is None else metrics(out, ref)
        row["cos"][name], row["rel_l1"][name] = got["cos"], got["rel_l1"]
    return row


TITLE = "Accuracy against fp32 SDPA"


def body(result: dict) -> str:
    """Cosine similarity and relative L1 per model, inputs and method, then notes."""
    rows, meta = result["rows"], result["meta"]
    names = list(rows[0]["cos"])
    text = ""
    for key, title in (("cos", "cosine similarity"), ("rel_l1", "relative L1")):
        text += f"\n**{title}**\n\n| model | inputs | " + " | ".join(names) + " |\n"
        text += "|---|---|" + "---:|" * len(names) + "\n"
        for r in rows:
            text += f"| {r['label']} ({r['shape']}) | {r['inputs']} | " + " | ".join(
                "—" if r[key][n] is None else f"{r[key][n]:.{6 if key == 'cos' else 4}f}" for n in names) + " |\n"
    if meta.get("notes"):
        text += "\nNotes (first of each method):\n" + "".join(f"- {n}: {w}\n" for n, w in meta["notes"].items())
    return text.lstrip("\n")


def report(rows, meta: dict, names, path: Path) -> None:
    """path.{json,md}, and path.png: relative L1 on the structured inputs."""
    result = dict(meta=meta, rows=rows)
    write_results(path, meta, rows, document(TITLE, result, body(result)))
    shown = [r for r in rows if r["inputs"] == "structured"]
    chart(shown, names, path.with_suffix(".png"), meta, "rel_l1", "relative L1 against fp32 SDPA, structured inputs")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m sageattention.bench.accuracy", description=__doc__.splitlines()[0])
    add_selection(ap, METHODS)
    add_output_args(ap, "accuracy")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("sageattention.bench.accuracy needs a CUDA GPU", file=sys.stderr)
        return 2
    sa.set_sdpa_fallback(False)
    notes: dict = {}
    meta = dict(run_meta("sageattention.bench.accuracy", argv), notes=notes)
    path = stem(args.out, meta, args.name or "accuracy")
    rows = []
    for key in args.models:
        for structured in (False, True):
            rows.append(measure(MODELS[key], args.methods, structured, notes))
            print(json.dumps(rows[-1]), flush=True)
        report(rows, meta, args.methods, path)  # after every model: a run stopped by a time limit keeps its rows
    print(body(dict(meta=meta, rows=rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
