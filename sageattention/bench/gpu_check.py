"""Quick GPU sanity pass: every public function vs fp32 SDPA on a few shapes (used while developing kernels).

    python -m sageattention.bench.gpu_check     # prints cosine similarity and relative L1 per function and shape
"""
import argparse

import torch

import sageattention as sa
from sageattention.reference import causal_mask


def metrics(o, ref):
    o, ref = o.double().flatten(), ref.double().flatten()
    cos = (o @ ref / (o.norm() * ref.norm())).item()
    rel_l1 = ((o - ref).abs().sum() / ref.abs().sum()).item()
    return cos, rel_l1


def main(argv=None):
    argparse.ArgumentParser(prog="python -m sageattention.bench.gpu_check",
                            description=__doc__.splitlines()[0]).parse_args(argv)
    torch.manual_seed(0)
    fns = {
        "sageattn": sa.sageattn,
        "fp16_triton": sa.sageattn_qk_int8_pv_fp16_triton,
        "fp16_cuda": sa.sageattn_qk_int8_pv_fp16_cuda,
        "fp8_cuda": sa.sageattn_qk_int8_pv_fp8_cuda,
        "fp8_cuda_sm90": sa.sageattn_qk_int8_pv_fp8_cuda_sm90,
    }
    for (b, hq, hk, nq, nk, d, causal) in [(2, 8, 8, 1024, 1024, 128, False), (2, 8, 2, 1000, 1537, 64, True),
                                          (1, 4, 4, 333, 333, 96, True), (1, 4, 1, 64, 4096, 128, False)]:
        q = torch.randn(b, hq, nq, d, device="cuda", dtype=torch.float16)
        k = torch.randn(b, hk, nk, d, device="cuda", dtype=torch.float16)
        v = torch.randn(b, hk, nk, d, device="cuda", dtype=torch.float16)
        mask = causal_mask(nq, nk, "cuda") if causal else None
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.float(), k.float().repeat_interleave(hq // hk, 1), v.float().repeat_interleave(hq // hk, 1), attn_mask=mask)
        for name, fn in fns.items():
            out = fn(q, k, v, is_causal=causal)
            cos, l1 = metrics(out, ref)
            print(f"{name:14s} B{b} H{hq}/{hk} {nq}x{nk} d{d} causal={causal}: cos {cos:.6f} relL1 {l1:.4f}")


if __name__ == "__main__":
    main()
