"""sageattention.bench.models without a GPU: the shape table, the calls it builds, the TOPS formula, the measurement loop (with
stand-in timings), child processes, argument parsing and the report, on synthetic rows."""
import json
import sys
import warnings

import pytest
import torch

from sageattention.bench import models, workloads
from sageattention.bench.workloads import MODELS

# The shapes users run: (B, Hq, Hkv, Nq, Nk, d, layout, dtype, causal).
MODEL_SHAPES = {
    (1, 24, 24, 4608, 4608, 128, "NHD", "bfloat16", False),  # Flux 1024 px
    (2, 10, 10, 4096, 4096, 64, "NHD", "float16", False),  # SDXL self-attention
    (2, 10, 10, 4096, 77, 64, "NHD", "float16", False),  # SDXL cross-attention
    (2, 30, 30, 17776, 17776, 64, "HND", "float16", False),  # CogVideoX-2B
    (1, 40, 40, 32760, 32760, 128, "HND", "bfloat16", False),  # Wan2.1-14B 480p
    (1, 32, 8, 8192, 8192, 128, "HND", "bfloat16", True),  # LLM GQA prefill
    (1, 16, 16, 1024, 1024, 64, "HND", "float16", False),  # small call
}


def test_the_table_holds_the_model_shapes():
    got = {(m.b, m.hq, m.hk, m.nq, m.nk, m.d, m.layout, m.dtype, m.causal) for m in MODELS.values()}
    assert got == MODEL_SHAPES
    assert all(key == m.key for key, m in MODELS.items())


@pytest.mark.parametrize("key", list(MODELS))
def test_inputs_follow_the_models_layout_and_dtype(key):
    m = MODELS[key]
    q, k, v = workloads.inputs(m, device="meta")
    if m.layout == "NHD":
        assert q.shape == (m.b, m.nq, m.hq, m.d) and k.shape == v.shape == (m.b, m.nk, m.hk, m.d)
    else:
        assert q.shape == (m.b, m.hq, m.nq, m.d) and k.shape == v.shape == (m.b, m.hk, m.nk, m.d)
    assert {t.dtype for t in (q, k, v)} == {getattr(torch, m.dtype)}


@pytest.mark.parametrize("key", ["sdxl-cross", "llm-gqa"])
def test_calls_pass_sdpa_bhnd_views_and_sageattention_the_models_layout(key, monkeypatch):
    m = MODELS[key]
    seen = []
    monkeypatch.setattr(workloads, "sdpa", lambda q, k, v, **kw: seen.append(("sdpa", q.shape, k.shape, kw)) or q)
    for name in workloads.SAGE_FUNCTIONS:
        monkeypatch.setitem(workloads.SAGE_FUNCTIONS, name,
                            lambda q, k, v, **kw: seen.append(("sage", q.shape, k.shape, kw)))
    q, k, v = workloads.inputs(m, device="meta")
    calls = workloads.methods(m, q, k, v)
    assert tuple(calls) == workloads.METHODS
    for name, call in calls.items():
        out = call()
        assert name not in workloads.SDPA_BACKENDS or out.shape == q.shape  # back in the model's layout
    gqa = {"enable_gqa": True} if m.hk != m.hq else {}
    sdpa_calls = [s for s in seen if s[0] == "sdpa"]
    assert sdpa_calls == [("sdpa", (m.b, m.hq, m.nq, m.d), (m.b, m.hk, m.nk, m.d), dict(is_causal=m.causal, **gqa))] * 3
    sage_kw = [s[3] for s in seen if s[0] == "sage"]
    assert sage_kw == [dict(tensor_layout=m.layout, is_causal=m.causal)] * len(workloads.SAGE_FUNCTIONS)


def test_tops_counts_nq_times_nk_and_halves_causal():
    cross = MODELS["sdxl-cross"]
    assert cross.tops(2.0) == pytest.approx(4 * 2 * 10 * 4096 * 77 * 64 / 2e-3 / 1e12)
    llm = MODELS["llm-gqa"]
    assert llm.tops(1.0) == pytest.approx(workloads.attention_tops(1, 32, 8192, 8192, 128, False, 1.0) / 2)
    # query heads count, not key/value heads
    assert llm.tops(1.0) == pytest.approx(2 * 32 * 8192 * 8192 * 128 / 1e-3 / 1e12)


@pytest.mark.filterwarnings("ignore:running on Triton")  # the loop's calls, outside the recorder
def test_measure_times_each_method_and_keeps_going_past_one_that_raises(monkeypatch):
    m = MODELS["small"]
    count = {"sdpa flash": 0, "sageattn": 0}

    def call(name):
        def run():
            count[name] += 1
            if name == "sageattn":
                warnings.warn("running on Triton", RuntimeWarning)
        return run

    monkeypatch.setattr(models, "inputs", lambda m: ())
    monkeypatch.setattr(models, "methods", lambda m: {n: call(n) for n in count})
    monkeypatch.setattr(models, "sageattn_path", lambda m, qkv: "compiled sm90 kernels")
    monkeypatch.setattr(models, "median_ms", lambda fn, label: (fn(), None if "flash" in label else 0.5)[1])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    notes = {}
    row = models.measure(m, ["sdpa flash", "sageattn"], calls=5, notes=notes)
    assert row["sageattn_path"] == "compiled sm90 kernels"
    assert row["median_ms"] == {"sdpa flash": None, "sageattn": 0.5}
    assert row["tops"] == {"sdpa flash": None, "sageattn": round(m.tops(0.5), 1)}
    assert set(row["ms_per_call"]) == {"sageattn"} and row["ms_per_call"]["sageattn"] >= 0
    assert count == {"sdpa flash": 1, "sageattn": 1 + 1 + 5 * 5}  # timed once, warm-up, five loops
    assert notes == {"sageattn": "running on Triton"}
    # A long call loops fewer times (about 0.2 s of GPU work per loop, at least 10); calls=0 does not loop.
    monkeypatch.setattr(models, "median_ms", lambda fn, label: 50.0)
    count["sageattn"] = 0
    models.measure(m, ["sageattn"], calls=200, notes={})
    assert count["sageattn"] == 1 + 5 * 10  # warm-up, five loops
    assert "ms_per_call" not in models.measure(m, ["sageattn"], calls=0, notes={})


def test_the_first_call_process_loads_no_triton_before_the_call():
    # first_call imports workloads untimed: Triton loaded there would be missing from the first call's time.
    code = "import sys, sageattention.bench.workloads; print('{\"triton\": %s}' % ('triton' in sys.modules and 1 or 0))"
    assert models.child_json([sys.executable, "-c", code]) == [{"triton": 0}]


def test_child_json_reads_json_lines_or_reports_the_failure(capsys):
    assert models.child_json([sys.executable, "-c", "print('noise'); print('{\"a\": 1}')"]) == [{"a": 1}]
    assert models.child_json([sys.executable, "-c", "raise RuntimeError('no kernel for sm75')"]) is None
    assert "RuntimeError: no kernel for sm75" in capsys.readouterr().err


def test_the_first_call_process_names_what_it_supports(capsys):
    assert models.child_json(models.first_call_cmd(MODELS["small"], "xformers")) is None
    assert "unknown model 'small' or method 'xformers'; models: flux" in capsys.readouterr().err


def test_spread_is_max_over_min_of_every_process():
    assert models.spread_pct([10.0, 10.4, 10.2], 3) == 4.0
    assert models.spread_pct([10.0, None, 10.2], 3) is None
    assert models.spread_pct([10.0, 10.2], 3) is None  # a process failed


def test_arguments():
    args = models.parse_args(["--models", "flux,small", "--methods", "sdpa cudnn,sageattn", "--first-call"])
    assert (args.models, args.methods, args.first_call, args.spread) == (["flux", "small"], ["sdpa cudnn", "sageattn"],
                                                                         True, 0)
    defaults = models.parse_args([])
    assert (defaults.models, defaults.methods) == (list(MODELS), list(workloads.METHODS))


@pytest.mark.parametrize("argv, says", [
    (["--models", "flux,sd3"], "unknown ['sd3']; supported: flux, sdxl"),
    (["--methods", "xformers"], "supported: sdpa, sdpa flash, sdpa cudnn, sageattn"),
    (["--spread", "1"], "at least 2 processes"),
    (["--fresh-cache"], "add --first-call"),
    (["--calls", "0"], "at least 1"),
])
def test_bad_arguments_name_the_problem(argv, says, capsys):
    with pytest.raises(SystemExit):
        models.parse_args(argv)
    assert says in capsys.readouterr().err


def synthetic_rows():
    names = ["sdpa cudnn", "sageattn"]
    rows = [dict(model=m.key, label=m.label, shape=m.shape(), tops=dict(zip(names, tops)), ms_per_call={names[0]: 0.05},
                 first_call_s=dict(zip(names, (0.07, 1.8))), spread_pct=dict(zip(names, (1.5, None))),
                 imports_s={n: dict(import_torch_s=t, import_sageattention_s=0.2) for n, t in zip(names, (1.1, 1.3))})
            for m, tops in ((MODELS["flux"], (645.0, 593.2)), (MODELS["sdxl-cross"], (24.0, None)))]
    meta = dict(device="NVIDIA H100 80GB HBM3", driver="580.1", torch="2.9.0", triton="3.5.0", python="3.12.3",
                commit="0123456789abcdef", date="2026-01-02T03:04:05+00:00", tool="models",
                command="python -m sageattention.bench.models --first-call", notes={"sageattn": "running on Triton"})
    return rows, meta, names


def test_markdown_has_one_table_per_measured_column():
    rows, meta, names = synthetic_rows()
    text = models.body(dict(meta=meta, rows=rows))
    assert "| Flux 1024 px | B1 H24 N4608 d128 NHD bfloat16 | 645 | 593 |" in text
    assert "| SDXL cross-attn | B2 H10 Nq4096×Nk77 d64 NHD float16 | 24 | — |" in text
    assert "| Flux 1024 px | B1 H24 N4608 d128 NHD bfloat16 | 0.050 | — |" in text  # ms/call
    assert "| 0.07 | 1.80 |" in text and "| 1.5 | — |" in text
    assert "torch 1.10–1.30 s, sageattention 0.20–0.20 s" in text
    assert "- sageattn: running on Triton" in text
    rows[1]["sageattn_path"] = "sdpa: 77 keys (fewer than 128): quantizing K and V cannot pay off"
    assert "- SDXL cross-attn: sdpa: 77 keys" in models.body(dict(meta=meta, rows=rows))
    del rows[0]["spread_pct"], rows[1]["spread_pct"]
    assert "max/min" not in models.body(dict(meta=meta, rows=rows))


def test_report_writes_json_markdown_and_chart(tmp_path):
    pytest.importorskip("matplotlib")
    rows, meta, names = synthetic_rows()
    path = tmp_path / "NVIDIA_H100_80GB_HBM3" / "models"
    models.report(rows, meta, names, path)
    assert json.loads(path.with_suffix(".json").read_text()) == dict(meta=meta, rows=rows)
    text = path.with_suffix(".md").read_text()
    assert text.startswith("# Real-model attention benchmark\n\nNVIDIA H100 80GB HBM3, driver 580.1, torch 2.9.0, "
                           "Triton 3.5.0, Python 3.12.3; commit `0123456789abcdef`, 2026-01-02T03:04:05+00:00; "
                           "command: `python -m sageattention.bench.models --first-call`\n\n")
    assert text.endswith(models.body(dict(meta=meta, rows=rows)))
    assert path.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"


def test_main_puts_every_measurement_in_the_report(monkeypatch, tmp_path):
    pytest.importorskip("matplotlib")  # the chart; bench's extra, not test's
    children = []

    def child(cmd, env=None):  # stand-ins for the fresh processes: first calls, and the --spread processes
        children.append(cmd[2:])
        if cmd[2] == "sageattention.bench.first_call":
            return [dict(import_torch_s=1.0, import_sageattention_s=0.25, first_call_s=0.5)]
        return [dict(model="small", median_ms={"sageattn": 1.0 + 0.1 * len(children)})]

    monkeypatch.setattr(models, "child_json", child)
    monkeypatch.setattr(models, "measure", lambda m, names, calls, notes: dict(
        model=m.key, label=m.label, shape=m.shape(), tops={"sageattn": 100.0}, ms_per_call={"sageattn": 0.3}))
    monkeypatch.setattr(models, "run_meta", lambda module, argv: dict(
        device="GPU X", torch="t", triton="tr", python="p", command=f"python -m {module} {' '.join(argv)}"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    argv = ["--models", "small", "--methods", "sageattn", "--first-call", "--spread", "2", "--out", str(tmp_path)]
    assert models.main(argv) == 0
    report = json.loads((tmp_path / "GPU_X" / "models.json").read_text())
    assert report["meta"]["command"].startswith("python -m sageattention.bench.models --models small")
    (row,) = report["rows"]
    assert row["first_call_s"] == {"sageattn": 0.5}
    assert row["imports_s"] == {"sageattn": dict(import_torch_s=1.0, import_sageattention_s=0.25)}
    assert row["spread_ms"] == {"sageattn": [1.3, 1.4]}  # each process's median, in order
    assert row["spread_pct"] == {"sageattn": round((1.4 / 1.3 - 1) * 100, 1)}
    # warm-up, first call, spread
    assert [c[0] for c in children] == ["sageattention.bench.first_call"] * 2 + ["sageattention.bench.models"] * 2


def test_process_medians_keep_each_process_in_order(monkeypatch):
    """A process that failed (child_json None) leaves None in its place, so its spread is None, not a smaller one."""
    results = iter([[dict(model="small", median_ms={"sageattn": 1.0})], None,
                    [dict(model="small", median_ms={"sageattn": 1.2})]])
    monkeypatch.setattr(models, "child_json", lambda cmd, env=None: next(results))
    medians = models.process_medians([MODELS["small"], MODELS["flux"]], ["sageattn"], 3)
    assert medians == {"small": {"sageattn": [1.0, None, 1.2]}, "flux": {"sageattn": [None, None, None]}}
    assert models.spread_pct(medians["small"]["sageattn"], 3) is None


def test_a_run_stopped_midway_keeps_the_models_it_measured(monkeypatch, tmp_path):
    """A device call's time limit can stop the benchmark: every model measured so far is already in the report."""
    pytest.importorskip("matplotlib")

    def measure(m, names, calls, notes):
        if m.key == "sdxl":
            raise KeyboardInterrupt  # what `timeout -s INT` delivers
        return dict(model=m.key, label=m.label, shape=m.shape(), tops={"sageattn": 100.0})

    monkeypatch.setattr(models, "measure", measure)
    monkeypatch.setattr(models, "run_meta", lambda module, argv: dict(
        device="GPU X", torch="t", triton="tr", python="p", command=f"python -m {module}"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(KeyboardInterrupt):
        models.main(["--models", "flux,sdxl", "--methods", "sageattn", "--no-warm", "--out", str(tmp_path),
                     "--name", "partial"])
    report = json.loads((tmp_path / "GPU_X" / "partial.json").read_text())
    assert [r["model"] for r in report["rows"]] == ["flux"]
    assert "Flux" in (tmp_path / "GPU_X" / "partial.md").read_text()


def test_sdpa_methods_are_pinned_once_around_their_calls_not_per_call(monkeypatch):
    """Entering sdpa_kernel costs tens of µs of host time: a per-call pin would inflate SDPA's time per call."""
    m = MODELS["sdxl-cross"]
    calls = workloads.methods(m, *workloads.inputs(m, device="meta"))
    with workloads.pinned(calls["sdpa cudnn"]):
        assert torch.backends.cuda.cudnn_sdp_enabled() and not torch.backends.cuda.flash_sdp_enabled()
    with workloads.pinned(calls["sdpa flash"]):
        assert torch.backends.cuda.flash_sdp_enabled() and not torch.backends.cuda.cudnn_sdp_enabled()
    with workloads.pinned(calls["sdpa"]):  # PyTorch's own choice: every backend left enabled
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()
    monkeypatch.setattr(workloads, "sdpa_kernel", lambda backend: pytest.fail("pinned inside the call"))
    monkeypatch.setattr(workloads, "sdpa", lambda q, k, v, **kw: q)
    for name in workloads.SDPA_BACKENDS:
        calls[name]()


# off the fallback: the Triton kernels on the CPU (interpreter), the compiled ones on a GPU that has them
@pytest.mark.parametrize("fallback_on, route", [(True, ("sdpa",)), (False, ("triton", "compiled"))])
def test_host_bench_replays_the_call_sageattn_ends_in(fallback_on, route):
    import sageattention
    from sageattention.bench import host
    from sageattention import fallback
    from tests.sageattention.helpers import make_qkv

    q, k, v = make_qkv(hq=2, nq=40, nk=50, d=64, layout="NHD")
    fallback.set_sdpa_fallback(fallback_on)
    try:
        got_route, call = host.routed_kernel(q, k, v, "NHD", True)
        want = sageattention.sageattn(q, k, v, tensor_layout="NHD", is_causal=True)
    finally:
        fallback.set_sdpa_fallback(False)  # tests/sageattention/conftest.py's setting
    replayed = call()
    assert got_route.startswith(route)
    assert torch.equal(replayed[0] if isinstance(replayed, tuple) else replayed, want)


@pytest.mark.parametrize("wait, syncs", [(True, 5 + 5 + 1), (False, 5 + 1)])
def test_back_to_back_waits_for_the_gpu_only_when_asked(monkeypatch, wait, syncs):
    """wait=False times the host alone: no loop waits for the GPU before its time is read."""
    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: events.append("sync"))
    ms = models.back_to_back_ms(lambda: events.append("call"), calls=3, wait=wait)
    assert ms >= 0 and events.count("call") == 1 + 5 * 3 and events.count("sync") == syncs
    assert (("call", "sync", "sync") in zip(events, events[1:], events[2:])) == wait  # a loop's end waits
