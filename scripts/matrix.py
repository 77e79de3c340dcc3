"""`python -m scripts.matrix`: print a profile's variants as JSON (CI's generate-matrix job) or a table."""
from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

from scripts.ci import CIError, write_github_output
from scripts.variants import PACKAGES, PLATFORMS, Variant, VariantError, load


def console(stderr: bool = False) -> Console:
    """A console that doesn't squeeze tables to 80 columns when writing to a CI log."""
    return Console(stderr=stderr, width=None if sys.stdout.isatty() else 200)


def table(variants: list[Variant], title: str) -> Table:
    out = Table(title=title)
    for col in ("name", "platform", "torch", "CUDA", "Python", "build tag", "arch list", "wheel", "note"):
        # Names are copied from logs into commands: keep them on one line.
        out.add_column(col, no_wrap=col in ("name", "wheel"))
    for v in variants:
        out.add_row(v.name, v.platform, v.torch_version, v.cuda, v.python, v.build_tag,
                    v.cuda_arch_list, "none (conda only)" if v.no_wheel else v.wheel,
                    ", ".join(filter(None, ("stable ABI" if v.stable else "", "substitute" if v.substitute else ""))))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.matrix", description=__doc__)
    parser.add_argument("--package", required=True, choices=PACKAGES)
    parser.add_argument("--profile", default="default")
    parser.add_argument("--platform", choices=PLATFORMS, help="only this platform (default: both)")
    parser.add_argument("--format", choices=("json", "table"), default="table")
    parser.add_argument("--github-output", action="store_true",
                        help="also write matrix=<compact JSON> and count=<n> to $GITHUB_OUTPUT (CI's generate-matrix job)")
    args = parser.parse_args(argv)
    try:
        variants = load(args.package).select(args.profile, args.platform)
        rows = [v.to_json() for v in variants]
        if args.github_output:
            # One line per key; a job matrix can't be empty, so the workflow skips the build when count is 0.
            write_github_output({"matrix": json.dumps(rows, separators=(",", ":")),
                                 "count": str(len(variants))})
    except (VariantError, CIError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps(rows, indent=2))
    else:
        before, after = load(args.package).binaries(args.profile, args.platform)
        console().print(table(variants, f"{args.package} · profile {args.profile} · {len(variants)} variants · "
                                        f"{before} version-specific builds, {after} with the stable-ABI builds"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
