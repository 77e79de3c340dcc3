"""Real-model attention calls: the shapes users run, their inputs, the methods timed on them, their FLOP count.

Imports torch and sageattention only (no Triton, no run.py), so that first_call.py can time
`import sageattention` and a first call in a fresh process without anything loaded ahead of it.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

import sageattention
from sageattention import core


@dataclass(frozen=True)
class Model:
    key: str
    label: str
    b: int
    hq: int
    hk: int
    nq: int
    nk: int
    d: int
    layout: str = "HND"  # "NHD": [B, N, H, D], as diffusers' attention processors hold them
    dtype: str = "float16"
    causal: bool = False

    def shape(self) -> str:
        heads = f"Hq{self.hq} Hkv{self.hk}" if self.hk != self.hq else f"H{self.hq}"
        n = f"N{self.nq}" if self.nq == self.nk else f"Nq{self.nq}×Nk{self.nk}"
        extra = "".join(f" {x}" for x in (self.layout, self.dtype, "causal" if self.causal else "") if x)
        return f"B{self.b} {heads} {n} d{self.d}{extra}"

    def tops(self, ms: float) -> float:
        return attention_tops(self.b, self.hq, self.nq, self.nk, self.d, self.causal, ms)


MODELS = {m.key: m for m in (
    Model("flux", "Flux 1024 px", b=1, hq=24, hk=24, nq=4608, nk=4608, d=128, layout="NHD", dtype="bfloat16"),
    Model("sdxl", "SDXL 1024 px self-attn", b=2, hq=10, hk=10, nq=4096, nk=4096, d=64, layout="NHD"),
    Model("sdxl-cross", "SDXL cross-attn", b=2, hq=10, hk=10, nq=4096, nk=77, d=64, layout="NHD"),
    Model("cogvideox", "CogVideoX-2B", b=2, hq=30, hk=30, nq=17776, nk=17776, d=64),
    Model("wan", "Wan2.1-14B 480p", b=1, hq=40, hk=40, nq=32760, nk=32760, d=128, dtype="bfloat16"),
    Model("llm-gqa", "LLM GQA prefill", b=1, hq=32, hk=8, nq=8192, nk=8192, d=128, dtype="bfloat16", causal=True),
    Model("small", "small call", b=1, hq=16, hk=16, nq=1024, nk=1024, d=64),
)}

# "sdpa": the backend PyTorch picks, as a model calling SDPA gets it
SDPA_BACKENDS = {"sdpa": None, "sdpa flash": SDPBackend.FLASH_ATTENTION, "sdpa cudnn": SDPBackend.CUDNN_ATTENTION}


@core.prepared_calls
def sageattn_on_triton(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, return_lse=False, **kwargs):
    """sageattn on the Triton kernels whatever the GPU (on Hopper: what sageattn ran before the sm90 kernel),
    without the small-problem SDPA fallback."""
    return core._sageattn(q, k, v, tensor_layout, is_causal, sm_scale, return_lse, kwargs, kernels="triton")


SAGE_FUNCTIONS = {  # the public entry points, and sageattn pinned to the Triton kernels
    "sageattn": sageattention.sageattn,
    "sageattn triton": sageattn_on_triton,
    "qk_int8_pv_fp16_triton": sageattention.sageattn_qk_int8_pv_fp16_triton,
    "qk_int8_pv_fp16_cuda": sageattention.sageattn_qk_int8_pv_fp16_cuda,
    "qk_int8_pv_fp8_cuda": sageattention.sageattn_qk_int8_pv_fp8_cuda,
}
METHODS = (*SDPA_BACKENDS, *SAGE_FUNCTIONS)


def attention_tops(b: int, h: int, nq: int, nk: int, d: int, causal: bool, ms: float) -> float:
    """Two matmuls of B·H·Nq·Nk·D multiply-adds (2 flops each) per ms; a causal (square) mask skips half."""
    flops = 4 * b * h * nq * nk * d / (2 if causal else 1)
    return flops / (ms * 1e-3) / 1e12


def sdpa_call(backend: SDPBackend | None, q, k, v, layout="HND", **kwargs):
    """A no-argument call of SDPA, to be run under `pinned(call)`, which pins it to `backend` (None: PyTorch's
    choice); under that pin it raises where the backend cannot take the inputs. SDPA reads [B, H, N, D]: NHD inputs
    go in as transposed views and the output comes back to NHD in the call, as a model holding NHD activations
    (diffusers' attention processors) does it on every call; `sageattn(tensor_layout="NHD")` spares it that."""
    def run():
        if layout == "NHD":
            return sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **kwargs).transpose(1, 2)
        return sdpa(q, k, v, **kwargs)
    run.sdpa_backend = backend
    return run


def model_sdpa(m: Model, q, k, v, backend: SDPBackend | None = None):
    """`sdpa_call` on m's inputs (its layout, causal mask and GQA)."""
    gqa = {"enable_gqa": True} if m.hk != m.hq else {}
    return sdpa_call(backend, q, k, v, m.layout, is_causal=m.causal, **gqa)


def pinned(call):
    """The context a method's calls are timed in: an SDPA call's backend pin, entered once around all the calls.
    Entered per call, `sdpa_kernel` would add 15-30 µs of host time that a model calling SDPA does not pay."""
    backend = getattr(call, "sdpa_backend", None)
    return contextlib.nullcontext() if backend is None else sdpa_kernel(backend)


def inputs(m: Model, device="cuda", structured=False):
    """Seeded random q, k, v in the model's layout and dtype. structured: what real activations look like and
    quantization finds hard: every key shifted by a per-channel bias of 3.5 sigma, and 4 query channels scaled 5.5x."""
    def size(h, n):
        return (m.b, n, h, m.d) if m.layout == "NHD" else (m.b, h, n, m.d)

    torch.manual_seed(0)
    q, k, v = (torch.randn(size(m.hq, m.nq), device=device),
               *(torch.randn(size(m.hk, m.nk), device=device) for _ in range(2)))
    if structured:
        k += 3.5 * torch.randn(m.d, device=device)
        q[..., torch.randperm(m.d, device=device)[:4]] *= 5.5
    dtype = getattr(torch, m.dtype)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def methods(m: Model, q, k, v) -> dict:
    """Every method of METHODS as a no-argument call on these inputs, as a model would make it."""
    calls = {name: model_sdpa(m, q, k, v, backend) for name, backend in SDPA_BACKENDS.items()}
    for name, fn in SAGE_FUNCTIONS.items():
        calls[name] = lambda fn=fn: fn(q, k, v, tensor_layout=m.layout, is_causal=m.causal)
    return calls
