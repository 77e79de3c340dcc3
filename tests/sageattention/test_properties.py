"""Hypothesis property tests: random layouts, shapes, GQA, causal, head_dim, masks vs the reference."""
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.sageattention.helpers import DEVICE, VARIANTS, check_variant_vs_reference, make_qkv, runs_here

SETTINGS = settings(max_examples=20, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def problems(draw):
    hk = draw(st.sampled_from([1, 2]))
    return {
        "b": draw(st.integers(1, 2)),
        "hk": hk,
        "hq": hk * draw(st.sampled_from([1, 2, 3])),
        "nq": draw(st.integers(1, 90)),
        "nk": draw(st.integers(1, 90)),
        "d": draw(st.sampled_from([32, 48, 64, 80, 96, 128])),
        "layout": draw(st.sampled_from(["HND", "NHD"])),
        "strided": draw(st.booleans()),
        "is_causal": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**16)),
    }


@SETTINGS
@given(p=problems(), var=st.sampled_from([v for v in VARIANTS if runs_here(v)]))
def test_public_functions_match_reference(p, var):
    is_causal, layout = p.pop("is_causal"), p["layout"]
    q, k, v = make_qkv(**p)
    check_variant_vs_reference(var, q, k, v, layout, is_causal=is_causal, what=f"{var.name} {p} causal={is_causal}")


@SETTINGS
@given(p=problems(), kind=st.sampled_from(["bool", "additive"]), bcast=st.sampled_from(["full", "heads", "rows"]))
def test_masks_match_reference(p, kind, bcast):
    is_causal, layout = p.pop("is_causal"), p["layout"]
    q, k, v = make_qkv(**p)
    shape = {"full": (p["b"], p["hq"], p["nq"], p["nk"]), "heads": (p["b"], 1, p["nq"], p["nk"]),
             "rows": (p["nq"], p["nk"])}[bcast]
    gen = torch.Generator().manual_seed(p["seed"])
    keep = torch.rand(shape, generator=gen) > 0.25
    mask = keep if kind == "bool" else torch.where(keep, torch.randn(shape, generator=gen), float("-inf")).half()
    var = next(v for v in VARIANTS if v.name == "sageattn")
    check_variant_vs_reference(var, q, k, v, layout, is_causal=is_causal, attn_mask=mask.to(DEVICE))
