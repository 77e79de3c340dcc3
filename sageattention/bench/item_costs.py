"""What a work item of the sm90 kernel costs besides its tiles: the attention launch timed over items per program and
tiles per item.

    python -m sageattention.bench.item_costs [--out DIR]     # writes <gpu_dir>/item_costs.{json,md,png}

Shapes: batch 1, four query blocks of 128 rows per head (so that four programs read a head's K and V at once, from
L2, as in real calls), SMs x k / 4 heads for k = 1, 2 and 4 items per program, 128 x tiles keys per head, d 64 and
128, bf16. The time is the attention kernel's alone (torch profiler, mean of 20 calls), not the preparation's.
Derived per head_dim: a tile's time, from the k = 4 launches' growth from 16 to 32 tiles (taking an item's cost
besides its tiles as the same at both), and at each item length an item's cost besides its tiles,
(T(k = 4) - T(k = 1)) / 3 minus its tiles' time. An item's boundary (Q's copy
and quantization, the pipeline's start, the epilogue) is what the last round of a call and short sequences pay.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from sageattention.bench.results import document, pyplot, run_meta, save_chart, stem, write_results
from sageattention.bench.run import compiled_call, output_on_gpu

ITEMS_PER_PROGRAM = (1, 2, 4)
TILES = (1, 2, 4, 8, 16, 32)
QUERY_BLOCKS = 4


def attention_us(d: int, heads: int, tiles: int) -> float:
    q = torch.randn(1, heads, 128 * QUERY_BLOCKS, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, heads, 128 * tiles, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    call = compiled_call("sm90", q, k, v, False)
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            call()
        torch.cuda.synchronize()
    return sum(e.device_time_total for e in prof.key_averages() if "attention_sm90" in e.key) / 20


def derive(rows: list[dict]) -> dict:
    """{d: {"tile_us": ..., "item_us": {tiles: ...}}} from rows of (d, items_per_program, tiles, us)."""
    out = {}
    for d in sorted({r["d"] for r in rows}):
        t = {(r["items_per_program"], r["tiles"]): r["us"] for r in rows if r["d"] == d}
        k, long, short = max(ITEMS_PER_PROGRAM), max(TILES), max(TILES) // 2
        tile = (t[k, long] - t[k, short]) / (k * (long - short))
        out[d] = dict(tile_us=tile, item_us={n: (t[k, n] - t[1, n]) / (k - 1) - n * tile for n in TILES})
    return out


TITLE = "sm90 attention kernel: item and tile costs"


def body(result: dict) -> str:
    """The attention kernel's time per shape, then the derived tile and item costs."""
    rows = result["rows"]
    derived = derive(rows)
    lines = ["Attention kernel time, µs.", "",
             "| d | items per program | " + " | ".join(f"{n} tiles" for n in TILES) + " |",
             "|---|---|" + "---|" * len(TILES)]
    for d in derived:
        for k in ITEMS_PER_PROGRAM:
            us = {r["tiles"]: r["us"] for r in rows if r["d"] == d and r["items_per_program"] == k}
            lines.append(f"| {d} | {k} | " + " | ".join(f"{us[n]:.1f}" for n in TILES) + " |")
    lines += ["", "| d | a tile | an item besides its tiles, at " + ", ".join(map(str, TILES)) + " tiles |",
              "|---|---|---|"]
    for d, x in derived.items():
        lines.append(f"| {d} | {x['tile_us']:.2f} | " + ", ".join(f"{x['item_us'][n]:.1f}" for n in TILES) + " |")
    return "\n".join(lines) + "\n"


def chart(rows: list[dict], path: Path, meta: dict) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for d in sorted({r["d"] for r in rows}):
        for k in ITEMS_PER_PROGRAM:
            pts = [(r["tiles"], r["us"]) for r in rows if r["d"] == d and r["items_per_program"] == k]
            ax.plot(*zip(*pts), marker="o", label=f"d{d}, {k} items per program")
    ax.set_xlabel("tiles of 128 keys per item")
    ax.set_ylabel("attention kernel, µs")
    ax.legend(fontsize=7)
    save_chart(fig, path, meta)


def main(argv=None) -> int:
    output = output_on_gpu("sageattention.bench.item_costs", __doc__, "item_costs", argv)
    if output is None:
        return 2
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    meta = run_meta("sageattention.bench.item_costs", argv)
    rows = [dict(d=d, items_per_program=k, tiles=n, us=attention_us(d, sms * k // QUERY_BLOCKS, n))
            for d in (128, 64) for k in ITEMS_PER_PROGRAM for n in TILES]
    result = dict(meta=meta, rows=rows)
    path = stem(output[0], meta, output[1])
    write_results(path, meta, rows, document(TITLE, result, body(result)))
    chart(rows, path.with_suffix(".png"), meta)
    print(body(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
