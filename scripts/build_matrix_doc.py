"""`python -m scripts.build_matrix_doc --write|--check`: BUILD_MATRIX.md, generated from variants/."""
from __future__ import annotations

import argparse
import sys
from itertools import groupby

from packaging.version import Version

from scripts import arch_coverage
from scripts.variants import PACKAGES, PLATFORMS, ROOT, VARIANTS_DIR, Matrix, load, read

TARGET = ROOT / "BUILD_MATRIX.md"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(r) + " |" for r in rows), ""]


def _rows(m: Matrix, row_set: str) -> list[list[str]]:
    """One line per row and platform: the Pythons folded together."""
    out = []
    chosen = [v for v in m.variants if v.row_set == row_set]
    def key(v):
        return v.platform, v.stable, Version(v.requested_torch), Version(v.requested_cuda)

    for _, group in groupby(sorted(chosen, key=key), key=key):
        group = list(group)
        v = group[0]
        conda = f"torch {v.torch_version} + CUDA {v.cuda}" + (" (substitute)" if v.substitute else "")
        out.append([v.platform, _torch_label(v.requested_torch, v.stable), v.requested_cuda, conda, ", ".join(g.python for g in group), v.build_tag,
                    f"`{v.cuda_arch_list}`", " ".join(arch_coverage.served(v))])
    return out


def _torch_label(torch: str, stable: bool) -> str:
    return f"{torch} and up (stable ABI)" if stable else torch


def _binaries(m: Matrix, profile: str, platform: str) -> str:
    """A profile's builds on a platform: "today → with its stable-ABI builds" where it has some (Matrix.binaries)."""
    before, after = m.binaries(profile, platform)
    return f"{before} → {after}" if any(v.stable for v in m.select(profile, platform)) else str(before)


def _unserved(m: Matrix) -> list[str]:
    """What the package's archs.py lists but a build's device code does not run on (its nvcc cannot target it)."""
    gaps = {(v.platform, v.cuda): [a for a in arch_coverage.claimable(v.package) if a not in arch_coverage.served(v)]
            for v in m.variants}
    return [f"- {platform}, CUDA {cuda}: no compiled kernel for {', '.join(gap)} (nvcc {cuda} cannot target "
            f"{'it' if len(gap) == 1 else 'them'})" for (platform, cuda), gap in sorted(gaps.items()) if gap]


def render() -> str:
    forge = read(VARIANTS_DIR / "conda-forge.yaml", "conda_forge")
    lines = ["# Build matrix", "",
             "<!-- Generated from variants/ by `pixi run build-matrix-doc`; edit the data, not this file. -->", "",
             ("Every build is a conda package (rattler-build) exported as a wheel. Rows are what users asked for "
              "(seed rows from the original fork, current rows for today's torch); each becomes one conda build per "
              "platform, against what conda-forge's pytorch actually ships. Where conda-forge lacks a row's exact "
              "torch + CUDA on a platform, the build uses the substitute named below and its wheel's build tag "
              "says so."), "",
             "## What conda-forge ships (pytorch CUDA builds)", ""]
    lines += _table(["platform", "CUDA builds of pytorch"],
                    [[p, "; ".join(f"CUDA {b['cuda']}: torch {b['torch']}" for b in forge["pytorch_cuda_builds"][p])]
                     for p in PLATFORMS])
    lines += ["Build tag = torch major, minor, `0`, `.`, CUDA major and minor: `280.129` is torch 2.8 + CUDA 12.9. "
              "A stable-ABI build (docs/building.md) adds `up` after the torch it needs at least: `2100up.130` is "
              "torch 2.10 and up + CUDA 13.0, wheel tags `cp310-abi3` (every CPython from 3.10).", ""]
    for package in PACKAGES:
        m = load(package)
        v0 = m.variants[0]
        lines += [f"## {package} {v0.version}", "",
                  (f"Import `{v0.import_name}`, recipe `{v0.recipe}`. Wheels: "
                   f"`{package}-{v0.version}-<build tag>-cpXY-cpXY-<platform>.whl`, stable-ABI builds "
                   f"`{package}-{v0.version}-<build tag>-cp310-abi3-<platform>.whl`."), "",
                  "### Seed rows", ""]
        header = ["platform", "torch", "CUDA", "conda build", "Python", "build tag", "TORCH_CUDA_ARCH_LIST",
                  "compiled kernels run on"]
        lines += _table(header, _rows(m, "seed"))
        subs = sorted({(v.platform, v.substitute) for v in m.variants if v.substitute and v.row_set == "seed"})
        subs += sorted({(v.platform, f"torch {v.requested_torch}: {v.no_wheel}") for v in m.variants if v.no_wheel})
        lines += [f"- {platform}: {text}" for platform, text in subs] + ([""] if subs else [])
        lines += ["### Current rows", ""] + _table(header, _rows(m, "current"))
        gaps = _unserved(m)
        if gaps:
            lines += [(f"`{v0.import_name}` claims {', '.join(arch_coverage.claimable(package))} "
                       f"(`archs.py`); these builds lack compiled kernels for some of them:"), "", *gaps, ""]
        if m.unavailable:
            lines += ["Not built (no conda-forge pytorch to build against):", ""]
            lines += [f"- {u.platform}: torch {u.torch} + CUDA {u.cuda} (Python {', '.join(u.python)}): {u.why}"
                      for u in m.unavailable] + [""]
        lines += ["### Profiles", "",
                  f"`pixi run build-{v0.short} PROFILE`, `pixi run matrix --package {package} --profile PROFILE`. "
                  "Builds per platform; `a → b`: a version-specific builds today, b once the profile's stable-ABI "
                  "builds replace those they serve (same CUDA, torch from their floor on).", ""]
        lines += _table(["profile", "what", *PLATFORMS],
                        [[f"`{name}`", spec["description"], *(_binaries(m, name, p) for p in PLATFORMS)]
                         for name, spec in m.profiles.items()])
    tags = sorted({(v.build_tag, _torch_label(v.torch, v.stable), v.cuda) for p in PACKAGES for v in load(p).variants},
                  key=lambda t: (int(t[0].split(".")[0].removesuffix("up")), t[0]))
    lines += ["## Build tag decoding", ""] + _table(["build tag", "torch", "CUDA"], [list(t) for t in tags])
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.build_matrix_doc", description=__doc__)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--check", action="store_true", help="exit 1 when BUILD_MATRIX.md is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        TARGET.write_text(text)
        return 0
    if TARGET.exists() and TARGET.read_text() == text:
        return 0
    print("BUILD_MATRIX.md is out of date: run `pixi run build-matrix-doc`", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
