"""Gradients: every public function's backward is the gradient of exact attention at the same inputs (float64
autograd is the oracle), eager and compiled alike; gradients through the LSE are refused, never dropped."""
import pytest
import torch
from torch.nn.attention.bias import causal_lower_right

import sageattention as sa
from sageattention import backward, reference
from sageattention.inputs import to_hnd
from tests.sageattention.helpers import DEVICE, VARIANT_IDS, VARIANTS, make_qkv, metrics, skip_unless_runs

GRAD_COS = 0.999


def _leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


def fp64_grads(q, k, v, grad_out, layout="HND", **kw):
    """dq, dk, dv of float64 attention (reference.attention_fp64) on layout tensors."""
    q64, k64, v64 = _leaves(*(to_hnd(t, layout).cpu().double() for t in (q, k, v)))
    out, _ = reference.attention_fp64(q64, k64, v64, **kw)
    out.backward(to_hnd(grad_out, layout).cpu().double())
    return [to_hnd(t.grad, layout) for t in (q64, k64, v64)]


def assert_grads_close(grads, ref, what=""):
    for name, g, r in zip("qkv", grads, ref):
        assert g is not None, f"{what}: no gradient for {name}"
        assert g.shape == r.shape and torch.isfinite(g).all(), f"{what}: d{name} shape or finiteness"
        m = metrics(g.cpu(), r)
        assert m["cos"] >= GRAD_COS and m["rel_l1"] < 0.05, f"{what}: d{name} {m}"


@pytest.mark.parametrize("var", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_every_variant_backward_is_exact_attention(var, layout):
    """GQA, causal (top-left), unequal lengths, random and structured (K bias, Q outliers) inputs."""
    skip_unless_runs(var)
    q, k, v = make_qkv(b=2, hq=4, hk=2, nq=40, nk=70, d=64, layout=layout, seed=5, k_bias=2.0, q_outlier=4.0)
    g = torch.randn(q.shape, generator=torch.Generator().manual_seed(6)).to(q)
    ql, kl, vl = _leaves(q, k, v)
    out = var(ql, kl, vl, layout, is_causal=True)[0]
    out.backward(g)
    assert_grads_close([t.grad for t in (ql, kl, vl)], fp64_grads(q, k, v, g, layout, is_causal=True), var.name)


def test_residual_through_sageattn_keeps_the_attention_term():
    """x + sageattn(x, x, x): the gradient includes attention's (today's bug: a detached output dropped it)."""
    x, _, _ = make_qkv(hq=2, nq=48, d=64, seed=8)
    xl = x.detach().clone().requires_grad_()
    (xl + sa.sageattn(xl, xl, xl)).sum().backward()
    x64 = x.cpu().double().requires_grad_()
    (x64 + reference.attention_fp64(x64, x64, x64)[0]).sum().backward()
    assert metrics(xl.grad.cpu(), x64.grad)["cos"] >= GRAD_COS


@pytest.mark.parametrize("mask_kind", ["bool", "additive", "lower_right"])
def test_masks_and_rows_without_keys(mask_kind):
    """Masked scores get no gradient; rows that see no key (output 0) get none either."""
    nq, nk = 50, 30
    q, k, v = make_qkv(hq=2, nq=nq, nk=nk, d=64, seed=9)
    gen = torch.Generator().manual_seed(10)
    if mask_kind == "lower_right":
        keep = reference.causal_mask(nq, nk, offset=nk - nq)  # the first 20 rows see no key
    else:
        keep = torch.rand(nq, nk, generator=gen) > 0.3
        keep[:3] = False
    bias = torch.where(keep, torch.randn(nq, nk, generator=gen) if mask_kind == "additive" else 0.0, -torch.inf)
    mask = {"bool": keep.to(DEVICE), "additive": bias.to(DEVICE, torch.float16),
            "lower_right": causal_lower_right(nq, nk)}[mask_kind]
    g = torch.randn(q.shape, generator=gen).to(q)
    ql, kl, vl = _leaves(q, k, v)
    sa.sageattn(ql, kl, vl, attn_mask=mask).backward(g)
    # float64 oracle without rows that see no key (its 0/0 there would spread NaN into dk, dv): those rows attend to
    # every key instead and get no output gradient, which is what a constant 0 output means
    empty = ~keep.any(dim=1)
    ref_bias = torch.where(empty[:, None], 0.0, bias.half().double() if mask_kind == "additive" else bias.double())
    ref = fp64_grads(q, k, v, g.masked_fill(empty[:, None].to(g.device), 0), attn_mask=ref_bias)
    assert_grads_close([t.grad for t in (ql, kl, vl)], ref, mask_kind)
    assert (ql.grad[:, :, empty.to(DEVICE)] == 0).all()


def test_directional_derivative_matches_finite_differences():
    """gradcheck-style: <grad, u> against central differences of float64 attention along a random direction u."""
    q, k, v = make_qkv(hq=2, hk=1, nq=20, nk=24, d=32, seed=11)
    gen = torch.Generator().manual_seed(12)
    g = torch.randn(q.shape, generator=gen)
    ql, kl, vl = _leaves(q, k, v)
    sa.sageattn(ql, kl, vl, is_causal=True).backward(g.to(q))
    x = [t.cpu().double() for t in (q, k, v)]
    u = [torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in x]
    eps = 1e-6

    def f(sign):
        return (reference.attention_fp64(*(a + sign * eps * d for a, d in zip(x, u)), is_causal=True)[0]
                * g.double()).sum()
    numeric = ((f(1) - f(-1)) / (2 * eps)).item()
    analytic = sum((t.grad.cpu().double() * d).sum() for t, d in zip((ql, kl, vl), u)).item()
    assert abs(analytic - numeric) <= 0.01 * abs(numeric) + 1e-3, (analytic, numeric)


def test_varlen_backward_per_sequence():
    lens_q, lens_k = [5, 0, 17, 9], [7, 4, 17, 1]
    gen = torch.Generator().manual_seed(13)
    q = torch.randn(sum(lens_q), 4, 32, generator=gen).half().to(DEVICE)
    k, v = (torch.randn(sum(lens_k), 2, 32, generator=gen).half().to(DEVICE) for _ in range(2))
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
                  for n in (lens_q, lens_k))
    g = torch.randn(q.shape, generator=gen).to(q)
    ql, kl, vl = _leaves(q, k, v)
    sa.sageattn_varlen(ql, kl, vl, cu_q, cu_k, max(lens_q), max(lens_k), is_causal=True).backward(g)
    ref = [torch.zeros(t.shape, dtype=torch.float64) for t in (q, k, v)]
    for i in range(len(lens_q)):
        (a, b), (c, d) = cu_q[i:i + 2].tolist(), cu_k[i:i + 2].tolist()
        if b > a and d > c:
            seq = [t.transpose(0, 1)[None] for t in (q[a:b], k[c:d], v[c:d], g[a:b])]
            for r, gr, lo, hi in zip(ref, fp64_grads(*seq[:3], seq[3], is_causal=True), (a, c, c), (b, d, d)):
                r[lo:hi] = gr[0].transpose(0, 1)
    assert_grads_close([t.grad for t in (ql, kl, vl)], ref, "varlen")


def test_lse_gradients_are_refused_not_dropped():
    q, k, v = _leaves(*make_qkv(hq=2, nq=40, d=64, seed=14))
    out, lse = sa.sageattn(q, k, v, return_lse=True)
    with pytest.raises(RuntimeError, match="LSE"):
        (out.sum() + lse.sum()).backward(retain_graph=True)
    out.sum().backward()  # the output alone is fine with return_lse=True
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_mask_gradients_are_refused():
    q, k, v = _leaves(*make_qkv(hq=2, nq=40, d=64, seed=15))
    mask = torch.zeros(40, 40, device=DEVICE, dtype=torch.float16, requires_grad=True)
    with pytest.raises(ValueError, match="attn_mask"):
        sa.sageattn(q, k, v, attn_mask=mask)


def test_compiled_backward_equals_eager():
    """torch.compile (AOTAutograd traces the registered backward) gives eager's gradients, and refuses LSE ones."""
    q, k, v = make_qkv(hq=2, nq=40, nk=56, d=64, seed=16)

    def loss(q, k, v):
        return (sa.sageattn(q, k, v, is_causal=True) ** 2).sum()
    grads = []
    for fn in (loss, torch.compile(loss, backend="aot_eager", fullgraph=True)):
        leaves = _leaves(q, k, v)
        fn(*leaves).backward()
        grads.append([t.grad for t in leaves])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)

    def lse_loss(q, k, v):
        return sa.sageattn(q, k, v, return_lse=True)[1].sum()
    with pytest.raises(RuntimeError, match="LSE"):
        torch.compile(lse_loss, backend="aot_eager", fullgraph=True)(*_leaves(q, k, v)).backward()


def test_backward_chunks_agree():
    """The query-row blocks of the backward (CHUNK_ELEMENTS) join up: one row per block gives the same result."""
    q, k, v = make_qkv(b=1, hq=2, nq=9, nk=13, d=32, seed=17, device="cpu")
    g = torch.randn(q.shape, generator=torch.Generator().manual_seed(18)).half()
    whole = backward.exact_grads(g, q, k, v, None, True, 0, 0.2)
    old = backward.CHUNK_ELEMENTS
    try:
        backward.CHUNK_ELEMENTS = 1
        rowwise = backward.exact_grads(g, q, k, v, None, True, 0, 0.2)
    finally:
        backward.CHUNK_ELEMENTS = old
    for a, b in zip(whole, rowwise):
        torch.testing.assert_close(a, b)
