"""Where sageattn's quantized path overtakes SDPA: the measurement behind archs.py's "sdpa_below_keys".

    python -m sageattention.bench.crossover [--out DIR]     # writes <gpu_dir>/crossover.{json,md}

Per head_dim (64, 128), causal or not, and key count N (= query count), two batch shapes: the FA3 protocol's (16k
tokens per batch, heads x head_dim = 2048) and a single sequence of 24 (d128) or 20 (d64) heads, fp16. Each row
times sageattn with its SDPA fallback off (the quantized kernels, end to end through the public call) against
SDPA's own choice on the same inputs (what the fallback runs), medians of CUDA-event timings. The crossover of a
(head_dim, causal) pair is the smallest N from which the kernels are no more than 3 % slower on either batch shape
(closer than that, machines differ more than the methods: the same code measures 2-8 % apart on two H100s;
docs/decisions/0002-hopper-sdpa-crossovers.md).
"""
from __future__ import annotations

import sys

import torch

import sageattention
from sageattention.bench.results import document, run_meta, stem, write_results
from sageattention.bench.run import fa3_shape, median_ms, output_on_gpu
from sageattention.bench.workloads import attention_tops, sdpa_call

TOLERANCE = 0.97  # sageattn / SDPA throughput that still counts as "not slower"
KEYS = (1024, 2048, 3072, 4096, 4608, 5120, 6144, 8192, 12288, 16384)  # 4608: Flux at 1024 x 1024


def shapes():
    for d in (64, 128):
        for causal in (False, True):
            for n in KEYS:
                yield dict(batch="fa3", **fa3_shape(n, d, causal))
                yield dict(batch="one sequence", b=1, h=24 if d == 128 else 20, n=n, d=d, causal=causal)


def measure(s: dict) -> dict:
    q, k, v = (torch.randn(s["b"], s["h"], s["n"], s["d"], device="cuda", dtype=torch.float16) for _ in range(3))
    calls = {"sageattn": lambda: sageattention.sageattn(q, k, v, is_causal=s["causal"]),
             "sdpa": sdpa_call(None, q, k, v, is_causal=s["causal"])}
    tops = {}
    for name, fn in calls.items():
        ms = median_ms(fn, f"{name} on {s}")
        tops[name] = None if ms is None else round(attention_tops(s["b"], s["h"], s["n"], s["n"], s["d"], s["causal"],
                                                                  ms), 1)
    return dict(s, tops=tops)


def crossovers(rows) -> dict:
    """(d, causal) -> the smallest N from which sageattn reaches TOLERANCE x SDPA's throughput in every row at N and
    above (None: nowhere in the grid; a method that failed counts as a loss)."""
    out = {}
    for key in sorted({(r["d"], r["causal"]) for r in rows}):
        mine = [r for r in rows if (r["d"], r["causal"]) == key]
        wins = {n: all((r["tops"]["sageattn"] or 0) >= TOLERANCE * (r["tops"]["sdpa"] or float("inf"))
                       for r in mine if r["n"] == n)
                for n in sorted({r["n"] for r in mine})}
        out[key] = next((n for n in wins if all(wins[m] for m in wins if m >= n)), None)
    return out


TITLE = "sageattn (fallback off) against SDPA"


def body(result: dict) -> str:
    """Every row's throughputs and ratio, then the crossovers."""
    rows = result["rows"]
    text = ("| head_dim | causal | batch | B | H | N | sageattn TOPS | SDPA TOPS | ratio |\n"
            "|---:|---|---|---:|---:|---:|---:|---:|---:|\n")
    for r in rows:
        t = r["tops"]
        ratio = f"{t['sageattn'] / t['sdpa']:.2f}" if t["sageattn"] and t["sdpa"] else "—"
        text += (f"| {r['d']} | {'yes' if r['causal'] else 'no'} | {r['batch']} | {r['b']} | {r['h']} | {r['n']} | "
                 f"{t['sageattn']} | {t['sdpa']} | {ratio} |\n")
    text += f"\nCrossover (smallest N from which sageattn reaches {TOLERANCE} x SDPA on both batch shapes):\n"
    text += "".join(f"- head_dim {d}{', causal' if c else ''}: {n or 'none in the grid'}\n"
                    for (d, c), n in crossovers(rows).items())
    return text


def main(argv=None) -> int:
    output = output_on_gpu("sageattention.bench.crossover", __doc__, "crossover", argv)
    if output is None:
        return 2
    sageattention.set_sdpa_fallback(False)
    meta = run_meta("sageattention.bench.crossover", argv)
    rows = []
    for s in shapes():
        rows.append(measure(s))
        print(rows[-1], flush=True)
    result = dict(meta=meta, rows=rows)
    write_results(stem(output[0], meta, output[1]), meta, rows, document(TITLE, result, body(result)))
    print(body(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
