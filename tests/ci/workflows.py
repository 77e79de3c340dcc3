"""The GitHub workflows as data: PyYAML plus GitHub's rules for `on:` and its branch/tag filters."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

from scripts.ci import Decision, decide
from scripts.variants import ROOT

WORKFLOWS = ROOT / ".github" / "workflows"
REUSABLE = WORKFLOWS / "_build-wheels.yml"
# Caller workflow → (package, platform, runner prefix): names after the seed documents.
CALLERS = {
    "build-wheels-sage2-linux.yml": ("sageattention", "linux-64", "ubuntu-"),
    "build-wheels-sage2-linux-aarch64.yml": ("sageattention", "linux-aarch64", "ubuntu-24.04-arm"),
    "build-wheels-sage2-windows.yml": ("sageattention", "win-64", "windows-"),
    "build-wheels-sage3-linux.yml": ("sageattn3", "linux-64", "ubuntu-"),
    "build-wheels-sage3-linux-aarch64.yml": ("sageattn3", "linux-aarch64", "ubuntu-24.04-arm"),
    "build-wheels-sage3-windows.yml": ("sageattn3", "win-64", "windows-"),
}


def load_workflow(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    # YAML 1.1 reads the bare key `on` as the boolean True.
    if True in data:
        data["on"] = data.pop(True)
    return data


def _glob(pattern: str, name: str) -> bool:
    # GitHub filter globs: `**` matches anything, `*` anything but '/'.
    regex = re.escape(pattern).replace(r"\*\*", ".*").replace(r"\*", "[^/]*")
    return re.fullmatch(regex, name) is not None


def filter_matches(patterns: list[str], name: str) -> bool:
    """GitHub's filter semantics: patterns apply in order; a matching `!pattern` excludes what came before."""
    matched = False
    for pattern in patterns:
        if _glob(pattern.removeprefix("!"), name):
            matched = not pattern.startswith("!")
    return matched


def triggered(on: dict, event: str, ref: str) -> bool:
    """Whether `event` on `ref` starts a workflow with this `on:` (pull_request and dispatch: unfiltered here)."""
    if event not in on:
        return False
    if event != "push":
        return True
    spec = on[event] or {}
    kind, name = ("branches", ref.removeprefix("refs/heads/")) if ref.startswith("refs/heads/") \
        else ("tags", ref.removeprefix("refs/tags/"))
    if kind not in spec:
        # With only the other filter given, GitHub ignores pushes of this kind; with neither, it takes all.
        return not ({"branches", "tags"} & set(spec))
    return filter_matches(spec[kind], name)


def run(workflow: dict, event: str, ref: str, dispatch_profile: str = "") -> Decision | None:
    """What a caller workflow builds for an event: None when it doesn't start, else validate's decision."""
    if not triggered(workflow["on"], event, ref):
        return None
    package = workflow["jobs"]["build"]["with"]["package"]
    return decide(package, event, ref, dispatch_profile)


def run_steps(workflow: dict) -> list[tuple[str, dict]]:
    """(job, step) for every step with a `run:` script."""
    return [(job, step) for job, spec in workflow["jobs"].items() for step in spec.get("steps", []) if "run" in step]


def uses_steps(workflow: dict) -> list[dict]:
    return [step for spec in workflow["jobs"].values() for step in spec.get("steps", []) if "uses" in step]
