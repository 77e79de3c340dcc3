"""sageattention.bench.accuracy: its metrics, inputs, rows and report (on CPU the kernels run under Triton's interpreter)."""
import math

import pytest
import torch

from sageattention.bench import accuracy, workloads
from sageattention.bench.workloads import Model
from tests.sageattention.helpers import DEVICE

TINY = Model("tiny", "tiny GQA causal", b=1, hq=2, hk=1, nq=64, nk=80, d=64, layout="NHD", causal=True)


def test_metrics_against_the_reference():
    ref = torch.randn(1000, dtype=torch.float64)
    assert accuracy.metrics(ref.half(), ref)["cos"] > 0.99999
    assert accuracy.metrics(1.1 * ref, ref) == dict(cos=1.0, rel_l1=0.1)
    bad = ref.clone()
    bad[3] = float("inf")
    assert all(math.isnan(x) for x in accuracy.metrics(bad, ref).values())


def test_structured_inputs_bias_the_keys_and_scale_a_few_query_channels():
    plain = workloads.inputs(TINY, device="cpu")
    q, k, v = workloads.inputs(TINY, device="cpu", structured=True)
    assert torch.equal(v, plain[2])
    assert (k.float() - plain[1].float()).std(dim=(0, 1, 2)).max() < 1e-2  # one shift per channel
    assert (k.float() - plain[1].float()).abs().mean() > 1.0
    ratio = (q.float().abs().sum(dim=(0, 1, 2)) / plain[0].float().abs().sum(dim=(0, 1, 2)))
    assert sorted(ratio.round(decimals=2).tolist()).count(5.5) == 4


def test_rows_measure_each_method_and_record_one_that_raises(monkeypatch):
    monkeypatch.setattr(accuracy, "inputs", lambda m, structured: workloads.inputs(m, DEVICE, structured))

    def refuses(q, k, v, **kw):
        raise RuntimeError("GPU sm80 is not supported by this sageattention kernel")
    monkeypatch.setitem(accuracy.METHODS, "refuses", refuses)
    notes = {}
    row = accuracy.measure(TINY, ["sageattn", "sdpa bf16", "refuses"], structured=True, notes=notes)
    assert row["inputs"] == "structured" and row["shape"] == TINY.shape()
    assert row["cos"]["sageattn"] > 0.99 and row["rel_l1"]["sageattn"] < 0.08
    assert row["rel_l1"]["sdpa bf16"] < row["rel_l1"]["sageattn"]  # unquantized 16-bit: the floor
    assert row["cos"]["refuses"] is None
    assert notes["refuses"] == "RuntimeError: GPU sm80 is not supported by this sageattention kernel"
    row = dict(row, cos={n: row["cos"][n] for n in ("sageattn", "refuses")},
               rel_l1={n: row["rel_l1"][n] for n in ("sageattn", "refuses")})
    text = accuracy.body(dict(meta=dict(device="cpu", torch="x", triton="y", command="c", notes=notes), rows=[row]))
    assert "| tiny GQA causal (B1 Hq2 Hkv1 Nq64×Nk80 d64 NHD float16 causal) | structured | " in text
    assert f"{row['rel_l1']['sageattn']:.4f} | — |" in text


def test_arguments():
    assert accuracy.parse_args(["--models", "flux", "--methods", "sageattn,sdpa bf16"]).methods == ["sageattn",
                                                                                                 "sdpa bf16"]
    with pytest.raises(SystemExit):
        accuracy.parse_args(["--methods", "xformers"])
