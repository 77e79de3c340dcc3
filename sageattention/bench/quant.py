"""Bandwidth of sageattn's quantization passes (the end-to-end overhead over the attention kernel).

    python -m sageattention.bench.quant            # time each pass at the FA3 protocol's 16k tokens, d128
    python -m sageattention.bench.quant --sweep    # also try launch widths (sageattention.triton.quant's constants)

GB/s counts the bytes each pass must move (read inputs, write outputs); medians of CUDA-event timings.
"""
from __future__ import annotations

import argparse
import itertools

import torch
import triton

from sageattention.core import SAGEATTN_GRAN
from sageattention.quant_groups import k_grouping, q_grouping
from sageattention.triton import quant


def passes(q, k, v):
    """name -> (callable, bytes moved)."""
    n_in = q.numel() * q.element_size()
    qg, kg = q_grouping(SAGEATTN_GRAN), k_grouping(SAGEATTN_GRAN)
    k_mean, v_amax = quant.token_stats(k, v)
    return {
        "Q + K/V stats (1 launch)": (lambda: quant.launch(quant.Int8Job(q, qg), quant.KVJob(k, v)), n_in * 7 // 2),
        "K + FP8 V^T (1 launch)": (
            lambda: quant.launch(quant.Int8Job(k, kg, k_mean), quant.KVJob(None, v, None, v_amax)), n_in * 3),
        "K mean + V absmax": (lambda: quant.token_stats(k, v), 2 * n_in),
        "INT8 Q": (lambda: quant.quantize_int8(q, qg), n_in * 3 // 2),
        "INT8 K (smoothed)": (lambda: quant.quantize_int8(k, kg, k_mean), n_in * 3 // 2),
        "FP8 V^T": (lambda: quant.quantize_v_fp8(v, None, v_amax), n_in * 3 // 2),
    }


def time_passes(q, k, v) -> dict[str, tuple[float, float]]:
    out = {}
    for name, (fn, nbytes) in passes(q, k, v).items():
        ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        out[name] = (ms * 1e3, nbytes / (ms * 1e-3) / 1e9)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m sageattention.bench.quant", description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="try num_warps 4/8 and statistics-job shapes")
    args = parser.parse_args(argv)
    b, h, n, d = 4, 16, 4096, 128
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
    print(f"{torch.cuda.get_device_name()}  B={b} H={h} N={n} D={d} fp16")
    knobs = ("NUM_WARPS", "STATS_CHUNK", "STATS_ROWS")
    settings = [tuple(getattr(quant, name) for name in knobs)]
    if args.sweep:
        settings = list(itertools.product((4, 8), (256, 512, 1024), (16, 32, 64)))
    best: dict[str, tuple[float, tuple]] = {}
    for setting in settings:
        for name, value in zip(knobs, setting):
            setattr(quant, name, value)
        for name, (us, gbs) in time_passes(q, k, v).items():
            print(f"  {setting}  {name:26s} {us:7.1f} us  {gbs:6.0f} GB/s")
            if name not in best or us < best[name][0]:
                best[name] = (us, setting)
    print(f"fastest per pass {knobs}:")
    for name, (us, cfg) in best.items():
        print(f"  {name:26s} {us:7.1f} us  {cfg}")


if __name__ == "__main__":
    main()
