"""`python -m scripts.ci COMMAND`: what the GitHub workflows decide, kept here so the tests can call it.

  profile         event + ref (+ manual choice) -> build profile, and whether the run releases (validate job)
  check-build     one build job's outputs: the variant's conda package and wheel; CUDA >= the package's minimum
  summary         a profile's variants against the artifacts found, as a markdown table (build-summary job)
  release-assets  the wheels a tag's GitHub Release holds, from variants/ (--check DIR: DIR holds them all)
  release         create the tag's GitHub Release unless it exists, then upload this platform's assets (gh)
  upload-channel  upload conda packages to a prefix.dev channel (skipped with a notice when no key is set)
  pages           the pip indexes of every release's wheels, as the GitHub Pages site (docs/installing.md)

Release tags: v<version> releases sageattention (v2.2.0), v<version>-sage3 releases sageattn3 (v1.0.0-sage3).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from scripts.index_pages import write_indexes
from scripts.outputs import finished
from scripts.variants import PACKAGES, PLATFORMS, Variant, VariantError, cuda_floor_error, load
from scripts.wheel_names import is_wheel_named, wheel_flavour

DEFAULT_CHANNEL = "sageattention"  # prefix.dev channel when the PREFIX_CHANNEL variable is unset


class CIError(RuntimeError):
    """A run that must stop: a tag for another package, an unknown event, missing artifacts."""


@dataclass(frozen=True)
class Release:
    tag_suffix: str  # the tag is v<version><suffix>
    profile: str  # what a release tag builds


RELEASES = {"sageattention": Release("", "sage2-all"), "sageattn3": Release("-sage3", "sage3-all")}


@dataclass(frozen=True)
class Decision:
    profile: str
    release: bool
    why: str


def release_of(tag: str) -> tuple[str, str]:
    """(package, version) that a release tag names."""
    suffixed = [p for p, r in RELEASES.items() if r.tag_suffix and tag.endswith(r.tag_suffix)]
    package = suffixed[0] if suffixed else next(p for p, r in RELEASES.items() if not r.tag_suffix)
    version = tag.removeprefix("v").removesuffix(RELEASES[package].tag_suffix)
    try:
        Version(version)
        valid = tag.startswith("v") and version[:1].isdigit()
    except InvalidVersion:
        valid = False
    if not valid:
        forms = ", ".join(f"v<version>{r.tag_suffix} ({p})" for p, r in RELEASES.items())
        raise CIError(f"tag {tag!r} is not a release tag; expected {forms}")
    return package, version


def release_variants(tag: str, platform: str | None = None) -> list[Variant]:
    """The variants whose wheels a release tag publishes (both platforms unless one is given)."""
    package, version = release_of(tag)
    matrix = load(package)
    if version != matrix.version:
        raise CIError(f"tag {tag} says {package} {version}, but the sources build {package} {matrix.version} (its __version__); "
                      "move the tag or bump the version")
    chosen = matrix.select(RELEASES[package].profile, platform)
    return sorted(chosen, key=lambda v: (v.platform, Version(v.torch_version), Version(v.python)))


def decide(package: str, event: str, ref: str, dispatch_profile: str = "") -> Decision:
    """The profile a workflow run builds: PR default, main stable, release tag *-all, manual run its choice."""
    profiles = load(package).profiles
    if event == "pull_request":
        return Decision("default", False, "pull request: the default profile")
    if event == "workflow_dispatch":
        if dispatch_profile not in profiles:
            raise CIError(f"unknown profile {dispatch_profile!r} for {package}; supported: {', '.join(profiles)}")
        return Decision(dispatch_profile, False, "manual run: the chosen profile")
    if event == "push" and ref == "refs/heads/main":
        return Decision("stable", False, "push to main: the stable profile")
    if event == "push" and ref.startswith("refs/tags/"):
        tag = ref.removeprefix("refs/tags/")
        tagged, _ = release_of(tag)
        if tagged != package:
            raise CIError(f"tag {tag} releases {tagged}, not {package}; this workflow's on.push.tags should exclude it")
        release_variants(tag)  # the tag's version must be the one variants/ builds
        return Decision(RELEASES[package].profile, True, f"release tag {tag}: {RELEASES[package].profile}, then a release")
    raise CIError(f"no profile for event {event!r} on {ref!r}; the workflows build pull requests, pushes to main, "
                  "release tags and manual runs")


def write_github_output(values: dict[str, str]) -> None:
    """Append step outputs (key=value lines) to the file GitHub names in $GITHUB_OUTPUT."""
    target = os.environ.get("GITHUB_OUTPUT")
    if not target:
        raise CIError("GITHUB_OUTPUT is not set: --github-output only works inside a GitHub Actions step")
    with open(target, "a", encoding="utf-8") as fh:
        fh.writelines(f"{k}={v}\n" for k, v in values.items())


def outputs(v: Variant, where: Path) -> tuple[list[Path], list[Path]]:
    """The finished wheels and conda packages under `where` that are builds of `v`."""
    # One per file name: the pip index publishes copies of the wheels under its files/ (scripts/index_pages.py).
    wheels = {}
    for p in sorted(finished(where, "*.whl"), key=lambda p: "index" in p.relative_to(where).parts):
        if is_wheel_named(v.wheel, p.name):
            wheels.setdefault(p.name, p)
    wheels = list(wheels.values())
    condas = finished(where, f"{v.package}-{v.version}-{v.build_string_prefix}h*.conda")
    return wheels, condas


def build_problems(v: Variant, where: Path) -> list[str]:
    """What is missing or wrong in the outputs of one variant (empty when its job delivered)."""
    wheels, condas = outputs(v, where)
    found = []
    if v.no_wheel and wheels:
        found.append(f"found {', '.join(w.name for w in wheels)}, but this build gets no wheel: {v.no_wheel}")
    elif not v.no_wheel and len(wheels) != 1:
        found.append(f"expected one wheel named {v.wheel}, found {len(wheels)}")
    if len(condas) != 1:
        found.append(f"expected one conda package {v.package}-{v.version}-{v.build_string_prefix}h<hash>_<n>.conda, "
                     f"found {len(condas)}")
    floor = load(v.package).min_cuda
    for wheel in wheels:
        _, cuda = wheel_flavour(wheel.name)
        if floor and Version(cuda) < Version(floor):
            found.append(f"{wheel.name}: {cuda_floor_error(v.short, floor)} (this wheel is built for CUDA {cuda})")
    return found


def summary_markdown(package: str, profile: str, platform: str, where: Path) -> tuple[str, bool]:
    """The build-summary table and whether every variant of the profile delivered."""
    lines = [f"### {package} · profile `{profile}` · {platform}", "",
             "| variant | torch | CUDA | Python | wheel | conda package | result |", "|---|---|---|---|---|---|---|"]
    complete = True
    for v in load(package).select(profile, platform):
        wheels, condas = outputs(v, where)
        found = build_problems(v, where)
        complete &= not found
        lines.append(f"| {v.name} | {v.torch_version} | {v.cuda} | {v.python} | "
                     f"{', '.join(f'`{w.name}`' for w in wheels) or ('none (conda only)' if v.no_wheel else 'missing')} | "
                     f"{', '.join(f'`{c.name}`' for c in condas) or 'missing'} | "
                     f"{'ok' if not found else 'FAILED: ' + '; '.join(found)} |")
    return "\n".join(lines) + "\n", complete


def release_files(tag: str, platform: str, where: Path) -> list[Path]:
    """This platform's wheels and conda packages for a tag, after checking nothing is missing or extra."""
    variants = release_variants(tag, platform)
    problems = [f"{v.name}: {p}" for v in variants for p in build_problems(v, where)]
    extra = [w.name for w in finished(where, "*.whl") if not any(is_wheel_named(v.wheel, w.name) for v in variants)]
    problems += [f"unexpected wheel {name}: not a {platform} build of {tag}" for name in extra]
    if problems:
        raise CIError(f"{tag} on {platform}: release assets incomplete:\n  " + "\n  ".join(problems))
    return [p for v in variants for group in outputs(v, where) for p in group]


def release_notes(tag: str) -> str:
    package, version = release_of(tag)
    channel = os.environ.get("PREFIX_CHANNEL") or DEFAULT_CHANNEL
    rows = [f"| {v.platform} | {v.torch_version} | {v.cuda} | {v.python} | `{v.build_tag}`"
            f"{' (conda package only)' if v.no_wheel else ''} |"
            for v in release_variants(tag)]
    return "\n".join([
        f"{package} {version}: one wheel and one conda package per torch × CUDA × Python below.", "",
        "| platform | torch | CUDA | Python | build tag |", "|---|---|---|---|---|", *rows, "",
        f"conda: `conda install -c https://repo.prefix.dev/{channel} -c conda-forge {package}`  ",
        ("pip: download the wheel for your platform, Python and torch (build tag 280.129 = torch 2.8 + CUDA 12.9) "
         "and `pip install` it; see docs/installing.md."), ""])


def _gh(gh: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([gh, *args], capture_output=True, text=True, check=False)


def publish(tag: str, platform: str, where: Path, gh: str = "gh") -> list[Path]:
    """Create the release unless it exists (either platform's workflow may finish first), then upload."""
    files = release_files(tag, platform, where)
    if _gh(gh, "release", "view", tag).returncode != 0:
        with tempfile.TemporaryDirectory() as tmp:
            notes = Path(tmp) / "notes.md"
            notes.write_text(release_notes(tag), encoding="utf-8")
            package, version = release_of(tag)
            made = _gh(gh, "release", "create", tag, "--verify-tag", "--title", f"{package} {version}",
                       "--notes-file", str(notes))
        # Losing the race to the other platform's workflow is fine: the release exists now.
        if made.returncode != 0 and _gh(gh, "release", "view", tag).returncode != 0:
            raise CIError(f"gh release create {tag} failed: {made.stderr.strip()}")
    upload = _gh(gh, "release", "upload", tag, "--clobber", *map(str, files))
    if upload.returncode != 0:
        raise CIError(f"gh release upload {tag} failed: {upload.stderr.strip()}")
    return files


def upload_channel(where: Path, channel: str) -> int:
    """Upload every finished .conda under `where` with `rattler-build upload prefix`; the key comes from PREFIX_API_KEY."""
    packages = finished(where, "*.conda")
    if not packages:
        raise CIError(f"no .conda packages under {where}")
    if not os.environ.get("PREFIX_API_KEY"):
        print(f"::notice title=conda channel::PREFIX_API_KEY is not set: {len(packages)} packages not uploaded "
              f"to https://repo.prefix.dev/{channel} (add the repository secret to publish them)")
        return 0
    cli = shutil.which("rattler-build")
    if not cli:
        raise CIError("rattler-build is not on PATH; run this through `pixi run ci-upload-channel`")
    # rattler-build reads the key from the environment, so it never appears on a command line.
    return subprocess.run([cli, "upload", "prefix", "--channel", channel, "--skip-existing", *map(str, packages)],
                          check=False).returncode


def pages(out: Path, site_url: str, gh: str = "gh") -> dict:
    """Write the pip indexes (scripts.index_pages) of the wheels of every release of both packages into `out`.

    Each run rebuilds the whole site from the releases (GitHub Pages holds one site), so the last deployment has
    every wheel; the links point at the releases' downloads, hashed from a downloaded copy."""
    repo = os.environ.get("GITHUB_REPOSITORY")
    if not repo:
        raise CIError("GITHUB_REPOSITORY is not set: the index links point at https://github.com/<repo>/releases")
    listed = _gh(gh, "release", "list", "--limit", "1000", "--json", "tagName", "--jq", ".[].tagName")
    if listed.returncode != 0:
        raise CIError(f"gh release list failed: {listed.stderr.strip()}")
    wheels = {}
    with tempfile.TemporaryDirectory() as tmp:
        for tag in listed.stdout.split():
            try:
                release_of(tag)
            except CIError:
                continue  # not one of our release tags
            where = Path(tmp) / tag
            got = _gh(gh, "release", "download", tag, "--pattern", "*.whl", "--dir", str(where))
            if got.returncode != 0:
                raise CIError(f"gh release download {tag} failed: {got.stderr.strip()}")
            wheels.update({w: f"https://github.com/{repo}/releases/download/{tag}/{w.name}"
                           for w in finished(where, "*.whl")})
        if not wheels:
            raise CIError("no release holds wheels: nothing to index")
        return write_indexes(wheels, out, site_url)


def _run(args: argparse.Namespace) -> int:
    if args.command == "profile":
        decision = decide(args.package, args.event, args.ref, args.dispatch_profile)
        values = {"profile": decision.profile, "release": str(decision.release).lower()}
        print(f"{args.package}: {decision.why}", file=sys.stderr)
        print("\n".join(f"{k}={v}" for k, v in values.items()))
        if args.github_output:
            write_github_output(values)
        return 0
    if args.command == "check-build":
        v = load(args.package).named(args.variant)
        found = build_problems(v, args.dist)
        if found:
            print("\n".join(f"{v.name}: {p}" for p in found), file=sys.stderr)
            return 1
        print(f"{v.name}: ok ({', '.join(p.name for group in outputs(v, args.dist) for p in group)})")
        return 0
    if args.command == "summary":
        text, complete = summary_markdown(args.package, args.profile, args.platform, args.dist)
        print(text)
        if os.environ.get("GITHUB_STEP_SUMMARY"):
            with open(os.environ["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as fh:
                fh.write(text)
        return 0 if complete else 1
    if args.command == "release-assets":
        if args.check:
            print("\n".join(str(p) for p in release_files(args.tag, args.platform, args.check)))
        else:
            print("\n".join(v.wheel for v in release_variants(args.tag, args.platform) if not v.no_wheel))
        return 0
    if args.command == "release":
        files = publish(args.tag, args.platform, args.dist)
        print(f"{args.tag}: uploaded {len(files)} {args.platform} assets")
        return 0
    if args.command == "pages":
        listing = pages(args.out, args.site_url)
        print("\n".join(f"{name}: {', '.join(f'{p} {v[-1]}' for p, v in projects.items())}"
                        for name, projects in listing.items()))
        return 0
    return upload_channel(args.dist, args.channel)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.ci", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("profile", help="the profile (and release flag) for a workflow run")
    p.add_argument("--package", required=True, choices=PACKAGES)
    p.add_argument("--event", default=os.environ.get("GITHUB_EVENT_NAME", ""), help="default: $GITHUB_EVENT_NAME")
    p.add_argument("--ref", default=os.environ.get("GITHUB_REF", ""), help="default: $GITHUB_REF")
    p.add_argument("--dispatch-profile", default="", help="the profile chosen for a workflow_dispatch run")
    p.add_argument("--github-output", action="store_true", help="also write profile= and release= to $GITHUB_OUTPUT")
    p = sub.add_parser("check-build", help="one variant's conda package and wheel are in DIST")
    p.add_argument("--package", required=True, choices=PACKAGES)
    p.add_argument("--variant", required=True, help="e.g. linux-sage3-pytorch28-cu129-python312")
    p.add_argument("dist", type=Path, nargs="?", default=Path("dist"))
    p = sub.add_parser("summary", help="markdown table of a profile's builds (also to $GITHUB_STEP_SUMMARY)")
    p.add_argument("--package", required=True, choices=PACKAGES)
    p.add_argument("--profile", required=True)
    p.add_argument("--platform", required=True, choices=PLATFORMS)
    p.add_argument("dist", type=Path, nargs="?", default=Path("dist"))
    p = sub.add_parser("release-assets", help="the wheels a release tag publishes")
    p.add_argument("--tag", required=True, help="e.g. v1.0.0-sage3 or v2.2.0")
    p.add_argument("--platform", choices=PLATFORMS, help="only this platform (default: both)")
    p.add_argument("--check", type=Path, metavar="DIR", help="check DIR holds them all (needs --platform); print paths")
    p = sub.add_parser("release", help="create the GitHub Release if missing and upload this platform's assets")
    p.add_argument("--tag", required=True)
    p.add_argument("--platform", required=True, choices=PLATFORMS)
    p.add_argument("dist", type=Path, nargs="?", default=Path("dist"))
    p = sub.add_parser("upload-channel", help="upload the .conda packages under DIST to prefix.dev")
    p.add_argument("--channel", default=os.environ.get("PREFIX_CHANNEL") or DEFAULT_CHANNEL,
                   help=f"prefix.dev channel (default: $PREFIX_CHANNEL, else {DEFAULT_CHANNEL})")
    p.add_argument("dist", type=Path, nargs="?", default=Path("dist"))
    p = sub.add_parser("pages", help="pip indexes of every release's wheels, for GitHub Pages (uses gh)")
    p.add_argument("--out", type=Path, required=True, help="the site folder to write")
    p.add_argument("--site-url", required=True, help="where the site is served (the install helper's default)")
    args = parser.parse_args(argv)
    if args.command == "release-assets" and args.check and not args.platform:
        parser.error("release-assets --check needs --platform")
    try:
        return _run(args)
    except (CIError, VariantError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
