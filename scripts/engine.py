"""rattler-build's engine from the py-rattler-build wheel, for when the `rattler-build` CLI is not on PATH.

`python -m scripts.engine RECIPE PLATFORM OUTPUT_DIR VARIANT_JSON CHANNELS_JSON` builds one variant
(the recipe's package tests included) and prints the build's log, build script output included, to
stdout: the engine itself prints nothing, so without this a failed build only says
"Script failed to execute".
"""
from __future__ import annotations

import json
import sys
from typing import TextIO


class LogTo:
    """A rattler-build progress callback writing each log line to a text stream."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def on_log(self, event) -> None:
        self.stream.write(f"{event.message}\n")
        self.stream.flush()

    def on_build_step(self, event) -> None:
        self.on_log(event)

    def on_download_start(self, event) -> None: ...

    def on_download_progress(self, event) -> None: ...

    def on_download_complete(self, event) -> None: ...


def build(recipe: str, platform: str, output_dir: str, variant: dict[str, str], channels: list[str], *,
          log=sys.stdout, test_strategy: str = "native", include_recipe: bool = True) -> None:
    """Render and build every output of `recipe` for `platform` (note: unlike the CLI, the engine does not apply
    `build.skip`; `scripts.variants.load` refuses the variants it would skip)."""
    from rattler_build import PlatformConfig, RenderConfig, Stage0Recipe, ToolConfiguration, VariantConfig

    config = VariantConfig({key: [value] for key, value in variant.items()})
    render_config = RenderConfig(platform=PlatformConfig(target_platform=platform))
    rendered = Stage0Recipe.from_file(recipe).render(config, render_config)
    for output in rendered:
        output.run_build(tool_config=ToolConfiguration(test_strategy=test_strategy), output_dir=output_dir,
                         channels=channels, no_include_recipe=not include_recipe, progress_callback=LogTo(log))


if __name__ == "__main__":
    recipe, platform, out, variant, channels = sys.argv[1:]
    build(recipe, platform, out, json.loads(variant), json.loads(channels))
