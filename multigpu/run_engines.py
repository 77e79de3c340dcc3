"""Sequence-parallel engines with sageattention as their local attention, on the GPUs of one host.

    torchrun --nproc_per_node 2 multigpu/run_engines.py --out DIR        (multigpu/run.sh sets it up)

Each engine's own code runs unmodified (docs/multi_gpu.md says how each selects sageattention):
- xDiT: `USP` with its SAGE backend (`sageattn(q, k, v, is_causal=, return_lse=True)`, [B, H, S, D]), ring degree 2
  (PyTorch's templated ring attention merges the steps) and Ulysses degree 2;
- yunchang: `LongContextAttention` (USP) at Ulysses 2 and at ring 2, with its own SAGE_FP16 / SAGE_FP8 types and with
  `flash_attn_compat.flash_attn_forward` as its `attn_processor` running the same kernels ([B, S, H, D]);
- para-attn: `UlyssesAttnMode` with `sageattn` and with `flash_attn_compat.scaled_dot_product_attention` as
  `attn_func` ([B, H, S, D]).
Accuracy: the gathered output against fp32 SDPA over the whole sequence on one GPU (cosine, relative L1), causal and
not, GQA (8 query heads on 2 KV heads) where the engine serves it; a call the engine cannot make records its error.
Speed: Wan2.1-14B 720p attention (B1 H40 S75600 d128 bf16, 21 latent frames of 45 x 80 tokens) split over the GPUs,
ms per call of the whole engine call with sageattention or with cuDNN SDPA as its local kernel, and both kernels on
one GPU over the whole sequence for scale. Rank 0 writes DIR/multigpu.json after every row, so that a run cut short
keeps what it measured. Without CUDA it rehearses on CPU (gloo, Triton's interpreter; use --quick).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import importlib.metadata
import importlib.util
import json
import os
import sys
import time
import types
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import sageattention as sa
from sageattention.flash_attn_compat import flash_attn_forward, scaled_dot_product_attention
from sageattention.reference import error_metrics

ENGINES = ("xdit", "yunchang", "para_attn")
ACCURACY = dict(b=1, hq=8, s=8192, d=128)
WAN_720P = dict(b=1, hq=40, hk=40, s=75600, d=128)
QUICK_ACCURACY = dict(b=1, hq=4, s=256, d=64)
QUICK_BENCH = dict(b=1, hq=4, hk=4, s=512, d=64)
GQA_KV_HEADS = 2
# timed on the Wan shape: each engine's way to sageattn (its kernel chosen per GPU) and to cuDNN SDPA
BENCH_KERNELS = ("SAGE", "CUDNN", "flash_attn_compat:sageattn", "flash_attn_compat.scaled_dot_product_attention",
                 "cudnn")
# yunchang's SAGE_FP16 and SAGE_FP8 types: these public functions with these pv_accum_dtype (yunchang/kernels)
YUNCHANG_SAGE = {
    "SAGE_FP16": (sa.sageattn_qk_int8_pv_fp16_cuda, "fp32"),
    "SAGE_FP8": (sa.sageattn_qk_int8_pv_fp8_cuda, "fp32+fp32"),
}


class Env:
    """This process's rank, device and results."""

    def __init__(self, out: Path, quick: bool):
        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ.get("LOCAL_RANK", self.rank))
        self.cuda = torch.cuda.is_available()
        self.device = torch.device("cuda", self.local_rank) if self.cuda else torch.device("cpu")
        if self.cuda:
            torch.cuda.set_device(self.device)
        self.backend = "nccl" if self.cuda else "gloo"
        dist.init_process_group(self.backend, timeout=datetime.timedelta(minutes=3))
        self.quick = quick
        self.path = out / "multigpu.json"
        self.result = {"meta": meta(self), "accuracy": [], "bench": []}

    def record(self, table: str, row: dict) -> None:
        if self.rank == 0:
            self.result[table].append(row)
            print(json.dumps(row), flush=True)
            self.path.write_text(json.dumps(self.result, indent=1))

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def meta(env: Env) -> dict:
    versions = {}
    for dist_name in ("torch", "triton", "xfuser", "yunchang", "para_attn", "diffusers"):
        try:
            versions[dist_name] = importlib.metadata.version(dist_name)
        except importlib.metadata.PackageNotFoundError:
            versions[dist_name] = None
    return {"devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if env.cuda else
            ["cpu"], "world_size": env.world, "sageattention": sa.__version__, "versions": versions,
            "command": " ".join(sys.argv), "started": datetime.datetime.now(datetime.timezone.utc).isoformat()}


# ---------------------------------------------------------------- tensors

def full_qkv(env: Env, shape: dict, hk: int, seed: int):
    """q [B, Hq, S, D], k/v [B, Hk, S, D], the same on every rank (bf16)."""
    gen = torch.Generator(device=env.device).manual_seed(seed)
    b, s, d = shape["b"], shape["s"], shape["d"]
    return tuple(torch.randn(b, h, s, d, generator=gen, device=env.device, dtype=torch.bfloat16)
                 for h in (shape["hq"], hk, hk))


def to_layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    """HND <-> NHD (the same transpose both ways)."""
    return x if layout == "HND" else x.transpose(1, 2)


def local(env: Env, x_hnd: torch.Tensor, layout: str) -> torch.Tensor:
    """This rank's contiguous slice of the sequence, in the engine's layout."""
    return to_layout(x_hnd, layout).chunk(env.world, dim=2 if layout == "HND" else 1)[env.rank].contiguous()


def gathered(env: Env, out: torch.Tensor, layout: str) -> torch.Tensor:
    """The whole sequence's output from every rank's slice, as HND."""
    parts = [torch.empty_like(out) for _ in range(env.world)]
    dist.all_gather(parts, out.contiguous())
    return to_layout(torch.cat(parts, dim=2 if layout == "HND" else 1), layout)


def error_text(e: Exception) -> str:
    return f"{type(e).__name__}: {e}".splitlines()[0][:400]


def accuracy(env: Env, row: dict, fn, layout: str, qkv, ref: torch.Tensor) -> bool:
    """Runs fn on this rank's slices and records cos / rel_l1 of the gathered output against ref (or the error);
    whether it ran."""
    try:
        with torch.no_grad():
            out = fn(*(local(env, x, layout) for x in qkv))
        row.update(error_metrics(gathered(env, out, layout).float(), ref))
    except Exception as e:  # an engine or kernel refusing the call: recorded, the run goes on
        row["error"] = error_text(e)
    env.record("accuracy", row)
    return "error" not in row


def ms_per_call(env: Env, fn, args, calls: int, everyone: bool = True) -> float:
    """Wall time per call of `calls` calls after one warm-up; the slowest rank's (everyone=False: this rank's)."""
    with torch.no_grad():
        fn(*args)
        env.sync()
        if everyone:
            dist.barrier()
        start = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        env.sync()
    ms = torch.tensor((time.perf_counter() - start) * 1e3 / calls, device=env.device)
    if everyone:
        dist.all_reduce(ms, op=dist.ReduceOp.MAX)
    return ms.item()


def bench(env: Env, row: dict, fn, layout: str, qkv, ref: torch.Tensor) -> bool:
    """ms per engine call over this rank's slices, and the gathered output against ref; whether it ran."""
    try:
        args = [local(env, x, layout) for x in qkv]
        row["ms"] = ms_per_call(env, fn, args, calls=3 if env.quick else 10)
        with torch.no_grad():
            row.update(error_metrics(gathered(env, fn(*args), layout).float(), ref))
    except Exception as e:
        row["error"] = error_text(e)
    env.record("bench", row)
    return "error" not in row


def cudnn_sdpa(q, k, v, is_causal=False):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


def cudnn_ring_step(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, **flash_args):
    """A ring step on cuDNN SDPA, as a flash-attn-style forward on [B, S, H, D] returning (out, lse): the
    baseline kernel in yunchang's ring, through the same attn_processor hook sageattention uses."""
    out, lse, *_ = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, True, dropout_p, causal, False,
        scale=softmax_scale)
    return out.transpose(1, 2), lse.reshape(lse.shape[:3])


# ---------------------------------------------------------------- the engines: (mode, setup, teardown, kernels)

def import_xdit():
    """xDiT's attention path (USP, its backend registry, process groups, runtime state), imported without running
    `xfuser/__init__.py`, which imports every diffusion pipeline (transformers and more) that attention never uses.
    The modules themselves run unmodified."""
    if "xfuser" not in sys.modules:
        root = Path(importlib.util.find_spec("xfuser").submodule_search_locations[0])
        for name in ("xfuser", "xfuser.model_executor", "xfuser.model_executor.layers"):
            package = types.ModuleType(name)
            package.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
            sys.modules[name] = package
    from xfuser.core.distributed import init_distributed_environment, initialize_model_parallel, runtime_state
    from xfuser.config import xFuserArgs  # (after xfuser.core: the two import each other)
    from xfuser.core.distributed.attention_backend import AttentionBackendType
    from xfuser.core.distributed.parallel_state import destroy_model_parallel
    from xfuser.model_executor.layers.usp import USP
    return types.SimpleNamespace(init=init_distributed_environment, parallel=initialize_model_parallel,
                                 Args=xFuserArgs, runtime_state=runtime_state, destroy=destroy_model_parallel,
                                 Backend=AttentionBackendType, USP=USP)


def xdit(env: Env):
    x = import_xdit()
    x.init(world_size=env.world, rank=env.rank, local_rank=env.local_rank, backend=env.backend)

    def kernels(causal, gqa):
        def usp(backend):
            return lambda q, k, v: x.USP(q, k, v, is_causal=causal, backend=x.Backend[backend])
        return {"SAGE": usp("SAGE"), **({"CUDNN": usp("CUDNN")} if env.cuda and not gqa else {})}

    for mode, degrees in (("ring2", dict(ring_degree=env.world)), ("ulysses2", dict(ulysses_degree=env.world))):
        x.parallel(**degrees, backend=env.backend)
        # the runtime state a pipeline would create (USP reads its options), without a pipeline; xDiT's
        # `--attention_backend SAGE`
        config = x.Args(attention_backend="SAGE", **degrees).create_config()[0]
        x.runtime_state._RUNTIME = x.runtime_state.RuntimeState(config)
        yield mode, "HND", kernels
        x.destroy()


def yunchang(env: Env):
    from yunchang import LongContextAttention, set_seq_parallel_pg
    from yunchang.kernels import AttnType

    def layer(attn_type, processor=None):
        attn = LongContextAttention(ring_impl_type="basic", attn_type=attn_type, attn_processor=processor)
        return lambda causal: (lambda q, k, v: attn(q, k, v, causal=causal))

    for mode, ulysses, ring in (("ulysses2", env.world, 1), ("ring2", 1, env.world)):
        set_seq_parallel_pg(ulysses, ring, env.rank, env.world)
        # attn_type=None: yunchang's kernel selection then returns the attn_processor for every ring step
        compat = {"flash_attn_compat:sageattn": layer(None, flash_attn_forward)}
        for name, (fn, accum) in YUNCHANG_SAGE.items():
            compat[f"flash_attn_compat:{fn.__name__}"] = layer(None, functools.partial(
                flash_attn_forward, kernel=fn, pv_accum_dtype=accum))
        # yunchang's own SAGE types call the named functions with flash-attn's keywords, which they refuse: tried
        # once, at Ulysses (no ring step is left waiting on the other rank when the call fails)
        own = {f"AttnType.{name}": layer(AttnType[name]) for name in YUNCHANG_SAGE} if ring == 1 else {}
        baseline = layer(None, cudnn_ring_step)

        def kernels(causal, gqa):
            chosen = {name: make(causal) for name, make in compat.items()}
            if not gqa:
                chosen.update({name: make(causal) for name, make in own.items()})
            if env.cuda and not gqa:
                chosen["cudnn"] = baseline(causal)
            return chosen

        yield mode, "NHD", kernels


def para_attn(env: Env):
    from para_attn.para_attn_interface import UlyssesAttnMode

    def mode(attn_func, causal, context=contextlib.nullcontext):
        def run(q, k, v):
            with context(), UlyssesAttnMode(attn_func=attn_func):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return run

    def kernels(causal, gqa):
        chosen = {"flash_attn_compat.scaled_dot_product_attention": mode(scaled_dot_product_attention, causal)}
        if not gqa:  # SDPA needs enable_gqa=True, which para-attn's attn_func call does not pass
            chosen["sageattn"] = mode(sa.sageattn, causal)
        if env.cuda and not gqa:
            chosen["cudnn"] = mode(None, causal, functools.partial(sdpa_kernel, SDPBackend.CUDNN_ATTENTION))
        return chosen

    yield "ulysses2", "HND", kernels


# ---------------------------------------------------------------- runs

def run_mode(env: Env, name: str, mode: str, layout: str, kernels, acc: dict, wan: dict, wan_qkv, wan_ref) -> None:
    """One engine mode's accuracy cases, then its Wan timing. A failed ring step ends the mode: the transfers it had
    started to the next rank may be left unmatched, for the mode's later calls to receive."""
    ring_failed = dict(engine=name, mode=mode, error="a ring step failed: this mode's remaining cases are skipped")
    for causal in (False, True):
        for gqa in (False, True):
            hk = GQA_KV_HEADS if gqa else acc["hq"]
            qkv = full_qkv(env, acc, hk, seed=1 + causal + 2 * gqa)
            ref = F.scaled_dot_product_attention(*(x.float() for x in qkv), is_causal=causal, enable_gqa=gqa)
            for kernel, fn in kernels(causal, gqa).items():
                row = dict(engine=name, mode=mode, layout=layout, kernel=kernel, causal=causal, hq=acc["hq"], hk=hk,
                           s=acc["s"], d=acc["d"])
                if not accuracy(env, row, fn, layout, qkv, ref) and mode.startswith("ring"):
                    return env.record("accuracy", ring_failed)
    for kernel, fn in kernels(False, False).items() if wan_qkv is not None else ():
        if kernel in BENCH_KERNELS:
            row = dict(engine=name, mode=mode, layout=layout, kernel=kernel, causal=False, **wan,
                       ref="cuDNN SDPA, 1 GPU")
            if not bench(env, row, fn, layout, wan_qkv, wan_ref) and mode.startswith("ring"):
                return env.record("bench", ring_failed)


def run_engine(env: Env, name: str, *args) -> None:
    for mode, layout, kernels in {"xdit": xdit, "yunchang": yunchang, "para_attn": para_attn}[name](env):
        run_mode(env, name, mode, layout, kernels, *args)


def single_gpu(env: Env, wan: dict, wan_qkv) -> None:
    """Both kernels over the whole sequence on rank 0's GPU, while the others wait."""
    if env.rank == 0:
        for kernel, fn in (("sageattn", sa.sageattn), ("cudnn", cudnn_sdpa)):
            row = dict(engine="single GPU", mode="1 GPU", layout="HND", kernel=kernel, causal=False, **wan)
            try:
                row["ms"] = ms_per_call(env, fn, wan_qkv, calls=3 if env.quick else 10, everyone=False)
            except Exception as e:
                row["error"] = error_text(e)
            if kernel == "sageattn":
                row["sageattn_path"] = sa.explain(*wan_qkv)
            env.record("bench", row)
    dist.barrier()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    ap.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, of {ENGINES}")
    ap.add_argument("--quick", action="store_true", help="small shapes (the CPU rehearsal)")
    ap.add_argument("--no-bench", action="store_true", help="accuracy only")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    env = Env(args.out, args.quick)
    acc, wan = (QUICK_ACCURACY, QUICK_BENCH) if args.quick else (ACCURACY, WAN_720P)
    wan_qkv = wan_ref = None
    if not args.no_bench:
        wan_qkv = full_qkv(env, wan, wan["hk"], seed=0)
        single_gpu(env, wan, wan_qkv)
        with torch.no_grad():
            wan_ref = cudnn_sdpa(*wan_qkv).float() if env.cuda else F.scaled_dot_product_attention(
                *(x.float() for x in wan_qkv))
    for name in args.engines.split(","):
        try:
            run_engine(env, name, acc, wan, wan_qkv, wan_ref)
        except Exception as e:  # an engine that does not even set up: recorded, the next one runs
            env.record("accuracy", dict(engine=name, error=error_text(e)))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
