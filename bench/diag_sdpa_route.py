"""Diagnostic (session 17): why `sageattn` on the SDPA route costs more back to back than SDPA itself in some
processes. One process; bench.workloads' small call in NHD. Times sageattn and its parts back to back (µs per call,
median of 5 loops of 200), first alone, then after each other way of calling SDPA has run, cumulatively."""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench.models import back_to_back_ms
from bench.workloads import MODELS, inputs
from sageattention import explain, fallback, sageattn


def main() -> None:
    q, k, v = inputs(dataclasses.replace(MODELS["small"], layout="NHD"))
    scale = q.shape[-1] ** -0.5
    hnd = [t.transpose(1, 2) for t in (q, k, v)]
    probes = {
        "sageattn": lambda: sageattn(q, k, v, tensor_layout="NHD"),
        "fallback.sdpa": lambda: fallback.sdpa(q, k, v, "NHD", False, 0, scale),
        "explain": lambda: explain(q, k, v, tensor_layout="NHD"),
        "F.sdpa views": lambda: F.scaled_dot_product_attention(*hnd),
    }

    def pinned(backend):
        def call():
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(*hnd)
        return call

    contaminants = {
        "F.sdpa views scale=": lambda: F.scaled_dot_product_attention(*hnd, scale=scale),
        "F.sdpa contiguous": lambda: F.scaled_dot_product_attention(*(t.contiguous() for t in hnd)),
        "sdpa_kernel(FLASH) per call": pinned(SDPBackend.FLASH_ATTENTION),
        "sdpa_kernel(CUDNN) per call": pinned(SDPBackend.CUDNN_ATTENTION),
        "sdpa_kernel(EFFICIENT) per call": pinned(SDPBackend.EFFICIENT_ATTENTION),
        "torch.profiler": None,
    }
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}; explain: {explain(q, k, v, tensor_layout='NHD')}")

    def row(after: str) -> None:
        times = {name: 1e3 * back_to_back_ms(fn, 200) for name, fn in probes.items()}
        print(f"after {after:34s} " + "  ".join(f"{n} {t:7.1f}" for n, t in times.items()), flush=True)

    row("nothing")
    for name, fn in contaminants.items():
        if fn is None:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA]):
                for _ in range(20):
                    sageattn(q, k, v, tensor_layout="NHD")
                torch.cuda.synchronize()
        else:
            for _ in range(50):
                fn()
            torch.cuda.synchronize()
            probes[name] = fn
        row(name)
    # alternate sageattn with each other pattern in one loop: per pair
    for name, fn in list(probes.items())[1:]:
        pair = 1e3 * back_to_back_ms(lambda: (sageattn(q, k, v, tensor_layout="NHD"), fn()), 200)
        print(f"sageattn + {name:32s} per pair {pair:7.1f}", flush=True)


if __name__ == "__main__":
    main()
