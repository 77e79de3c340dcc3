"""sageattention.bench.warm compiles the Triton path by name (no GPU needed): on a GPU that the compiled kernels serve, a plain
sageattn call would compile no Triton kernel and leave the benchmark's Triton column to autotune while timed."""
from __future__ import annotations

import torch

import sageattention.bench.workloads
from sageattention.bench import warm


def test_each_worker_runs_the_triton_path_on_its_key(monkeypatch):
    calls = []
    randn = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *shape, device=None, dtype=None: randn(*shape, dtype=dtype))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(sageattention.bench.workloads, "sageattn_on_triton",
                        lambda q, k, v, is_causal: calls.append((tuple(q.shape), q.dtype, is_causal)))
    assert warm._compile((256, 64, True, 4)) == "N=256 d64 H=4 causal"
    assert calls == [((1, 4, 256, 64), torch.float16, True)]
