"""sageattention.bench as a tool of the product: its results' provenance, the report that writes docs/performance.md's
generated blocks, the CLIs' help, and `import sageattention` leaving it alone. No GPU."""
from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

from sageattention.bench import crossover, report, results

META = dict(device="GPU X", driver="1.2", torch="t", triton="tr", python="p", commit="c0ffee", tool="crossover",
            date="2026-01-02T03:04:05+00:00", command="python -m sageattention.bench.crossover --out o")
ROWS = [dict(batch="fa3", b=1, h=16, n=n, d=128, causal=False, tops={"sageattn": sage, "sdpa": 500.0})
        for n, sage in ((1024, 300.0), (4096, 600.0))]


def doc_with(*keys, filler="old text\n") -> str:
    blocks = "".join(f"<!-- BEGIN generated:{k} -->\n{filler}<!-- END generated:{k} -->\n" for k in keys)
    return f"# Performance\n\nProse stays; `<!-- BEGIN generated:... -->` quoted is no marker.\n\n{blocks}\nMore prose.\n"


@pytest.fixture
def tree(tmp_path):
    """A results directory with one result and its plot, and a document with a stale block for it."""
    path = tmp_path / "results" / "GPU_X" / "crossover.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(dict(meta=META, rows=ROWS)))
    path.with_suffix(".png").write_bytes(b"\x89PNG")
    (tmp_path / "docs").mkdir()
    doc = tmp_path / "docs" / "performance.md"
    doc.write_text(doc_with("GPU_X/crossover"))
    return tmp_path, doc, ["--doc", str(doc), "--results", str(tmp_path / "results")]


def test_report_writes_the_tables_and_provenance_then_check_passes(tree, capsys):
    root, doc, args = tree
    assert report.main([*args, "--check"]) == 1
    assert "stale generated blocks: GPU_X/crossover" in capsys.readouterr().err
    assert report.main(args) == 0
    text = doc.read_text()
    table = crossover.body(dict(meta=META, rows=ROWS))  # the renderer of crossover.md, not a copy
    assert f"<!-- BEGIN generated:GPU_X/crossover -->\n\n{table.strip()}\n\n" in text
    assert "| 128 | no | fa3 | 1 | 16 | 4096 | 600.0 | 500.0 | 1.20 |" in text
    assert ("GPU X, driver 1.2, torch t, Triton tr, Python p; commit `c0ffee`, 2026-01-02T03:04:05+00:00; command: "
            "`python -m sageattention.bench.crossover --out o`; plot: [crossover.png](../results/GPU_X/crossover.png)\n\n"
            "<!-- END generated:GPU_X/crossover -->") in text
    assert text.startswith("# Performance\n\nProse stays;") and text.endswith("\nMore prose.\n")
    assert "old text" not in text
    assert report.main([*args, "--check"]) == 0
    # a new result makes the block stale again
    rows = [dict(r, tops={"sageattn": 700.0, "sdpa": 500.0}) for r in ROWS]
    (root / "results" / "GPU_X" / "crossover.json").write_text(json.dumps(dict(meta=META, rows=rows)))
    assert report.main([*args, "--check"]) == 1
    assert doc.read_text() == text  # --check writes nothing


@pytest.mark.parametrize("key, says", [
    ("GPU_Y/crossover", "no results for GPU 'GPU_Y'"),
    ("GPU_X/models", "no suite 'models' in"),
])
def test_unknown_gpu_or_suite_names_what_exists(tree, capsys, key, says):
    _, doc, args = tree
    doc.write_text(doc_with("GPU_X/crossover", key))
    assert report.main(args) == 2
    err = capsys.readouterr().err
    assert says in err and ("GPUs: GPU_X" in err or "suites: crossover" in err)


def test_a_begin_without_its_end_is_an_error(tree, capsys):
    _, doc, args = tree
    doc.write_text("<!-- BEGIN generated:GPU_X/crossover -->\ntext\n<!-- END generated:GPU_X/models -->\n")
    assert report.main(args) == 2
    assert "without a matching END" in capsys.readouterr().err


def test_run_meta_records_the_provenance(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "NVIDIA H200")
    monkeypatch.setattr(results, "driver_version", lambda: "580.1")
    meta = results.run_meta("sageattention.bench.crossover", ["--out", "/tmp/x y"])
    assert meta["command"] == "python -m sageattention.bench.crossover --out '/tmp/x y'"
    assert meta["tool"] == "crossover" and meta["driver"] == "580.1" and meta["date"].endswith("+00:00")
    assert meta["commit"] != "unknown"  # this checkout's HEAD
    assert results.stem(results.RESULTS, meta, "crossover") == results.RESULTS / "NVIDIA_H200" / "crossover"


def test_commit_falls_back_to_the_environment_outside_a_checkout(monkeypatch, tmp_path):
    monkeypatch.setattr(results, "ROOT", tmp_path)
    monkeypatch.setenv(results.COMMIT_ENV, "abc123")
    assert results.commit() == "abc123"
    monkeypatch.delenv(results.COMMIT_ENV)
    assert results.commit() == "unknown"


TOOLS = ["accuracy", "crossover", "first_call", "gpu_check", "host", "item_costs", "models", "profile", "quant",
         "report", "run", "sass_loops", "warm"]


@pytest.mark.parametrize("tool", TOOLS)
def test_every_tool_has_help(tool, capsys):
    with pytest.raises(SystemExit) as done:
        importlib.import_module(f"sageattention.bench.{tool}").main(["--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m sageattention.bench.{tool}")


def test_import_sageattention_leaves_the_benchmarks_out():
    code = "import sys, sageattention; print(sorted(m for m in sys.modules if m.startswith('sageattention.bench')))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"


def test_the_results_of_record_carry_their_provenance():
    for path in sorted(results.RESULTS.glob("*/*.json")):
        meta = json.loads(path.read_text())["meta"]
        assert path.parent.name == results.gpu_dir(meta["device"]), path
        assert {"device", "commit", "date", "command", "tool"} <= meta.keys(), path
        # multigpu/run_engines.py's results are tabled by hand in docs/multi_gpu.md; the others by the report
        assert meta["tool"] in (*report.TOOLS, "run_engines"), path


def test_performance_doc_is_current():
    if not report.DOC.is_file():
        pytest.skip(f"no {report.DOC}")
    assert report.main(["--check"]) == 0
