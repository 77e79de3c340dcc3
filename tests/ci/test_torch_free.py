"""The tooling tests need neither torch nor Triton: CI machines that build or publish packages lack both, and an
early Triton import would stop tests/sageattention/conftest.py from switching on Triton's interpreter in time."""
import ast
import json
import subprocess
import sys
from pathlib import Path

from scripts.variants import ROOT

TOOLING = [d for d in ("tests/ci", "tests/distribution", "tests/rehearsal", "tests/build") if (ROOT / d).is_dir()]
HEAVY = {"torch", "triton"}
VENDORED = {"site-packages", ".pixi", ".venv"}  # environments that may live inside the checkout

# Collects the tooling tests as if torch and Triton were not installed, noting every attempt to import them (a
# conftest may catch the ImportError), then names the files of the repository that it imported.
COLLECT = """
import importlib.abc, json, os, sys
attempts = []
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("torch", "triton"):
            attempts.append(name)
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Absent())
import pytest
rc = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[1:]])
files = {os.path.realpath(f) for f in (getattr(m, "__file__", None) for m in list(sys.modules.values())) if f}
ours = sorted(f for f in files if f.startswith(os.getcwd() + os.sep))
print("RESULT " + json.dumps({"attempts": attempts, "files": ours}))
sys.exit(rc)
"""


def heavy_imports(path) -> set:
    """torch/Triton imports anywhere in a file, inside functions too (those run only at test time)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.add(node.module.split(".")[0])
    return found & HEAVY


def collect_without_torch():
    proc = subprocess.run([sys.executable, "-c", COLLECT, *TOOLING], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, f"collecting {TOOLING} without torch/Triton failed:\n{proc.stdout}{proc.stderr}"
    result = json.loads(proc.stdout.splitlines()[-1].removeprefix("RESULT "))
    assert not result["attempts"], f"collecting {TOOLING} tried to import {result['attempts']}"
    return [Path(f) for f in result["files"]]


def test_tooling_tests_collect_and_import_nothing_that_needs_torch():
    files = {p for d in TOOLING for p in (ROOT / d).rglob("*.py")} | {ROOT / "tests" / "conftest.py"}
    # Our own modules the collection imported (scripts/, tests/...): lazy imports in them would run at test time.
    files |= {p for p in collect_without_torch() if p.suffix == ".py" and not VENDORED & set(p.parts)}
    offenders = {str(p.relative_to(ROOT)): sorted(heavy_imports(p)) for p in sorted(files) if heavy_imports(p)}
    assert not offenders, f"tooling tests or the modules they import import torch/Triton: {offenders}"


def test_the_check_sees_a_lazy_torch_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import json\n\ndef f():\n    from torch.nn import functional\n    import triton.language\n")
    assert heavy_imports(sample) == HEAVY

