"""Render a recipe for chosen variants with rattler-build's own engine (no solve, no network).

The render-only path is used rather than `Stage0Recipe.render()` because only it applies the
recipe's `build.skip` conditions, exactly as a real build would.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from scripts.variants import ROOT, Variant

# The engine's render-only entry point, run in a child so its stdout (the JSON) can be captured.
_ENGINE = (
    "import sys, warnings\n"
    "warnings.simplefilter('ignore')\n"
    "from rattler_build import build_recipes\n"
    "build_recipes([sys.argv[1]], variant_config=[sys.argv[2]], target_platform=sys.argv[3],\n"
    "              output_dir=sys.argv[4], render_only=True, ignore_recipe_variants=True)\n"
)


def write_variant_config(variants: list[Variant], path: Path) -> None:
    """One zipped variant config for all `variants` (same platform, so the same keys)."""
    keys = list(variants[0].variant_config())
    config = {key: [v.variant_config()[key] for v in variants] for key in keys}
    config["zip_keys"] = [keys]
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def render_command(recipe: Path, variant_config: Path, platform: str, output_dir: Path) -> list[str]:
    """The `rattler-build` CLI when on PATH, else the same engine from the py-rattler-build wheel."""
    cli = shutil.which("rattler-build")
    if cli:
        return [cli, "build", "--render-only", "--ignore-recipe-variants", "--recipe", str(recipe),
                "-m", str(variant_config), "--target-platform", platform, "--output-dir", str(output_dir)]
    return [sys.executable, "-c", _ENGINE, str(recipe), str(variant_config), platform, str(output_dir)]


def render(variants: list[Variant]) -> dict[Variant, dict | None]:
    """Rendered recipe (the engine's JSON) per variant; None where the recipe skips it."""
    by_platform: dict[str, list[Variant]] = {}
    for v in variants:
        by_platform.setdefault(v.platform, []).append(v)
    result: dict[Variant, dict | None] = {v: None for v in variants}
    for platform, group in by_platform.items():
        for recipe, members in _by_recipe(group).items():
            for output in _render_group(recipe, members, platform):
                used = output["build_configuration"]["variant"]
                for v in members:
                    if all(used.get(k, val) == val for k, val in v.variant_config().items()):
                        result[v] = output
    return result


def _by_recipe(variants: list[Variant]) -> dict[Path, list[Variant]]:
    groups: dict[Path, list[Variant]] = {}
    for v in variants:
        groups.setdefault(ROOT / v.recipe, []).append(v)
    return groups


def _render_group(recipe: Path, variants: list[Variant], platform: str) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="sage-render-") as tmp:
        config = Path(tmp) / "variants.yaml"
        write_variant_config(variants, config)
        proc = subprocess.run(render_command(recipe, config, platform, Path(tmp) / "out"),
                              capture_output=True, text=True, cwd=tmp, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"rendering {recipe} for {platform} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout)
