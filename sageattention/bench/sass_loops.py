"""Did a change reorder the attention kernels' tile loops? Compiles the attention kernels of csrc/ for the working
tree and for a git revision and compares their SASS, kernel by kernel and loop by loop.

    python -m sageattention.bench.sass_loops                  # the working tree against HEAD, every family
    python -m sageattention.bench.sass_loops --against main~2 --families sm90

ptxas orders a tile loop anew when code outside it changes, and the same instructions in another order measured
2-4 % slower (docs/decisions/0011-sm90-v-stats-staged-with-q.md, docs/decisions/0012-sm90-d128-two-q-buffers.md):
compare before spending GPU time, and A/B on the device whatever this reports as reordered. A loop is "same"
(identical text), "renamed" (identical but for register numbers), or "reordered", with the share of its opcode
sequence the two have in common. Needs a source checkout (csrc/, build_rules.py, git), nvcc and cuobjdump (the CUDA
toolkit's, or the one bundled with triton); no GPU.
"""
from __future__ import annotations

import argparse
import difflib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

import build_rules

ROOT = Path(__file__).resolve().parents[2]  # the source checkout (csrc/, build_rules.py)

SOURCES = ("attention_d64.cu", "attention_d128.cu")
MMA = re.compile(r"\b[A-Z]*MMA\b|\b[A-Z]*GMMA\.")  # IMMA, HMMA, QMMA, IGMMA., QGMMA.: what tile loops exist for


def cuobjdump() -> str | None:
    """The CUDA toolkit's cuobjdump, else the copy shipped inside the triton package."""
    if shutil.which("cuobjdump"):
        return shutil.which("cuobjdump")
    try:
        import triton
    except ImportError:
        return None
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(bundled) if os.access(bundled, os.X_OK) else None


def target_of(sm: str) -> build_rules.Target:
    """An arch as nvcc's sm_ names spell it: "90a" -> Target("9.0", "a")."""
    major, minor, suffix = re.fullmatch(r"(\d+)(\d)([af]?)", sm).groups()
    return build_rules.Target(f"{major}.{minor}", suffix)


def native_target(family: str) -> build_rules.Target:
    """The arch a family's SASS is compared on: its only arch (sm_90a), else its oldest."""
    info = build_rules.archs.FAMILIES[family]
    return build_rules.Target(info["only"][0], info["suffix"]) if "only" in info else build_rules.Target(info["min_arch"])


def kernels(sass: str) -> dict[str, list[tuple[int, str]]]:
    """cuobjdump -sass text -> {kernel name: [(address, instruction without its ';')]}."""
    found, current = {}, None
    for line in sass.splitlines():
        header = re.match(r"\s+Function : (\S+)", line)
        if header:
            current = found.setdefault(header.group(1), [])
            continue
        code = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+([^;]*);", line)
        if code and current is not None:
            current.append((int(code.group(1), 16), code.group(2).strip()))
    return found


def loops(code: list[tuple[int, str]]) -> list[tuple[int, int]]:
    """(first, last) indices of every loop that holds an MMA: a branch back to an earlier address closes one. Nested
    loops each count, outermost last for a shared end."""
    index = {address: i for i, (address, _) in enumerate(code)}
    found = []
    for i, (address, instruction) in enumerate(code):
        for target in re.findall(r"\bBRA (?:`?\(?)?0x([0-9a-f]+)", instruction):
            start = index.get(int(target, 16))
            if start is not None and int(target, 16) < address and any(MMA.search(op) for _, op in code[start:i]):
                found.append((start, i))
    return found


def opcode(instruction: str) -> str:
    words = instruction.split()
    return words[1] if words[0].startswith("@") else words[0]


def _text(body, registers: bool) -> list[str]:
    """Instructions with branch targets blanked (code elsewhere moves them); registers: numbered, else not."""
    out = [re.sub(r"(\b(?:BRA|BSSY|BRX|CALL|JMP)\b.*?)0x[0-9a-f]+", r"\1X", op) for _, op in body]
    return out if registers else [re.sub(r"\b(U?R|U?P)\d+\b", r"\1", op) for op in out]


def compare_loop(base, new) -> tuple[str, float]:
    """How two loop bodies differ: ("same" | "renamed" | "reordered", the share of their opcode sequences in common)."""
    if _text(base, True) == _text(new, True):
        return "same", 1.0
    if _text(base, False) == _text(new, False):
        return "renamed", 1.0
    common = difflib.SequenceMatcher(None, [opcode(op) for _, op in base], [opcode(op) for _, op in new],
                                     autojunk=False).ratio()
    return "reordered", common


def compare(base_sass: str, new_sass: str, key=lambda name: name) -> list[dict]:
    """One row per kernel of either, kernels paired by key(name): whether its SASS is identical, and how each of its
    MMA loops compares."""
    base, new = ({key(name): code for name, code in kernels(sass).items()} for sass in (base_sass, new_sass))
    rows = []
    for name in sorted(base.keys() | new.keys()):
        if name not in base or name not in new:
            rows.append(dict(kernel=name, status="only in " + ("new" if name in new else "base"), loops=[]))
            continue
        a, b = base[name], new[name]
        if _text(a, True) == _text(b, True):
            rows.append(dict(kernel=name, status="identical", loops=[]))
            continue
        la, lb = loops(a), loops(b)
        compared = []
        for (r, t), (s, e) in zip(la, lb):
            kind, common = compare_loop(a[r:t + 1], b[s:e + 1])
            compared.append(dict(size=t - r + 1, growth=(e - s) - (t - r), kind=kind, common=common))
        status = "loops differ in number" if len(la) != len(lb) else "differs"
        rows.append(dict(kernel=name, status=status, loops=compared))
    return rows


def compile_sass(root: Path, family: str, source: str, target: build_rules.Target, out: Path, nvcc: str,
                 tool: str) -> str:
    """The SASS of csrc/<family>/<source> under root, compiled for one arch with the build's flags and macros."""
    cubin = out / f"{family}_{Path(source).stem}_{target.sm}.cubin"
    macro = "-D{}={}".format(*build_rules.FP8_F16_ACCUM_MACRO)
    subprocess.run([nvcc, "-std=c++17", *build_rules.NVCC_FLAGS, macro, f"-I{root / 'csrc'}", *target.gencode(),
                    "-cubin", "-o", str(cubin), str(root / "csrc" / family / source)],
                   check=True, capture_output=True, text=True)
    return subprocess.run([tool, "-sass", str(cubin)], check=True, capture_output=True, text=True).stdout


def checkout(revision: str, into: Path) -> Path:
    """csrc/ as it was at a git revision."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision, "csrc"], check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def readable(sass: str) -> dict[str, str]:
    """Kernel name -> the template it instantiates, without parameters, namespaces or trailing `false` arguments, so
    that a template parameter added with a default pairs the old kernels with the new (c++filt's demangling; the raw
    names where there is no c++filt)."""
    names = list(kernels(sass))
    if not shutil.which("c++filt"):
        return {n: n for n in names}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    plain = [re.sub(r"^void |\(.*\)$|sage::(sm\d+::)?", "", d) for d in out]
    return {n: re.sub(r"(, false)+>$", ">", d) for n, d in zip(names, plain)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sageattention.bench.sass_loops", description=__doc__.splitlines()[0])
    ap.add_argument("--against", default="HEAD", help="git revision to compare the working tree with (HEAD)")
    ap.add_argument("--families", default=",".join(build_rules.archs.FAMILIES), help="comma-separated (all)")
    args = ap.parse_args(argv)
    nvcc, tool = shutil.which("nvcc"), cuobjdump()
    if nvcc is None or tool is None:
        print(f"needs nvcc and cuobjdump (found nvcc={nvcc}, cuobjdump={tool})", file=sys.stderr)
        return 2
    families = [f for f in args.families.split(",") if f]
    console = Console(width=None if sys.stdout.isatty() else 200)
    with tempfile.TemporaryDirectory() as tmp:
        base_root = checkout(args.against, Path(tmp) / "base")
        jobs = [(root, family, source, native_target(family), Path(tmp) / side) for family in families
                for source in SOURCES for side, root in (("base_cubins", base_root), ("new_cubins", ROOT))]
        for *_, out in jobs:
            out.mkdir(exist_ok=True)
        with ThreadPoolExecutor(os.cpu_count()) as pool:
            sass = list(pool.map(lambda job: compile_sass(*job, nvcc, tool), jobs))
    table = Table(title=f"attention kernels: working tree against {args.against}")
    for column in ("source", "kernel", "SASS", "MMA loops (instructions: kind, opcodes in common)"):
        table.add_column(column)
    for i in range(0, len(jobs), 2):
        _, family, source, _, _ = jobs[i]
        names = readable(sass[i]) | readable(sass[i + 1])
        for row in compare(sass[i], sass[i + 1], key=names.get):
            shown = "; ".join(f"{l['size']}{l['growth']:+d}: {l['kind']}"
                              + (f" {100 * l['common']:.1f} %" if l["kind"] == "reordered" else "")
                              for l in row["loops"])
            table.add_row(f"csrc/{family}/{source}", row["kernel"], row["status"], shown)
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
