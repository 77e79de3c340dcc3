"""Build outputs as later steps see them: finished files only, never the scratch of a killed build or export."""
from __future__ import annotations

from pathlib import Path


def finished(root: Path, pattern: str) -> list[Path]:
    """Files under root matching pattern, outside hidden folders: builds and exports write into hidden scratch
    folders (.build-*, .partial-*) and move a file out only once it is complete, so a killed run leaves its
    partial files there."""
    return sorted(p for p in root.rglob(pattern) if not any(part.startswith(".") for part in p.relative_to(root).parts))
