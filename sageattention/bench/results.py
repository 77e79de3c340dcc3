"""Where a benchmark's results go and what they carry: <results>/<gpu_dir>/<suite>.{json,md,png}.

gpu_dir is the device name with spaces as underscores (NVIDIA_H100_80GB_HBM3). Every JSON is {"meta": ..., "rows":
...}; meta holds the device, driver, torch, Triton, Python, the commit, the UTC date, the exact command and the tool
that wrote it (the module of sageattention.bench whose `body` renders its tables: sageattention.bench.report uses it).
Imports nothing heavier than the standard library at module level.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the source checkout, when the package runs from one
# A checkout's bench/results; installed elsewhere, bench/results under the working directory.
RESULTS = ROOT / "bench" / "results" if (ROOT / "bench" / "results").is_dir() else Path("bench") / "results"
COMMIT_ENV = "SAGE_BENCH_COMMIT"  # the commit measured, where the code runs outside a git checkout


def gpu_dir(device: str) -> str:
    return device.replace(" ", "_")


def commit() -> str:
    """$SAGE_BENCH_COMMIT where set (a copy of the tree whose .git is not the code's), else HEAD of the checkout this
    package runs from (with "-dirty" when tracked files outside bench/results differ), else "unknown"."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    def git(*args):
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode == 0 and (ROOT / "sageattention").is_dir():
            dirty = git("diff", "--quiet", "HEAD", "--", ".", ":!bench/results").returncode != 0
            return head.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):  # no git
        pass
    return "unknown"


def driver_version() -> str | None:
    """The NVIDIA driver's version (nvidia-smi, else /proc/driver/nvidia/version); None where neither says."""
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        if smi.returncode == 0 and smi.stdout.strip():
            return smi.stdout.split()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        found = re.search(r"Kernel Module\s+(\S+)", Path("/proc/driver/nvidia/version").read_text())
        return found and found.group(1)
    except OSError:
        return None


def run_meta(module: str, argv) -> dict:
    """The provenance of a run of `module` (a sageattention.bench module) with these arguments (None: sys.argv's)."""
    import torch
    import triton

    args = argv if argv is not None else sys.argv[1:]
    return dict(device=torch.cuda.get_device_name(), driver=driver_version(), torch=torch.__version__,
                triton=triton.__version__, python=platform.python_version(), commit=commit(),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                command=shlex.join(["python", "-m", module, *map(str, args)]), tool=module.rpartition(".")[2])


def provenance(meta: dict) -> str:
    """One line: device, software, commit, date and the exact command."""
    software = ", ".join(f"{what} {meta[key]}" for what, key in (("driver", "driver"), ("torch", "torch"),
                                                                 ("Triton", "triton"), ("Python", "python"))
                         if meta.get(key))
    return (f"{meta['device']}, {software}; commit `{meta.get('commit', 'unknown')}`, {meta.get('date', 'undated')}; "
            f"command: `{meta['command']}`")


def document(title: str, result: dict, body: str) -> str:
    """A result's markdown file: title, provenance, then the tool's tables."""
    return f"# {title}\n\n{provenance(result['meta'])}\n\n{body}"


def add_output_args(ap: argparse.ArgumentParser, suite: str) -> None:
    """--out and --name; --name is None when not given (the caller's default: `suite`)."""
    ap.add_argument("--out", type=Path, default=RESULTS,
                    help=f"results directory: writes <out>/<gpu_dir>/<name>.{{json,md,png}} (default: {RESULTS})")
    ap.add_argument("--name", help=f"file name of the results, without suffix (default: {suite})")


def stem(out: Path, meta: dict, name: str) -> Path:
    return out / gpu_dir(meta["device"]) / name


def write_results(path: Path, meta: dict, rows: list, md: str) -> None:
    """path.json (meta and rows) and path.md."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1) + "\n")
    path.with_suffix(".md").write_text(md)


def pyplot():
    """matplotlib's pyplot, drawing off-screen (the bench extra's dependency)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_chart(fig, path: Path, meta: dict) -> None:
    """The figure as a PNG whose title names the device and the commit."""
    fig.suptitle(f"{meta['device']}, commit {meta.get('commit', 'unknown')[:12]}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
