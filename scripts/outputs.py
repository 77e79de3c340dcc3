"""Build outputs as later steps see them: finished files only, never the scratch of a killed build or export; and
the time every archive entry we write carries."""
from __future__ import annotations

import os
from pathlib import Path


def finished(root: Path, pattern: str) -> list[Path]:
    """Files under root matching pattern, outside hidden folders: builds and exports write into hidden scratch
    folders (.build-*, .partial-*) and move a file out only once it is complete, so a killed run leaves its
    partial files there."""
    return sorted(p for p in root.rglob(pattern) if not any(part.startswith(".") for part in p.relative_to(root).parts))


ZIP_EPOCH = 315532800  # 1980-01-01 00:00 UTC, the earliest time a zip entry can carry


def source_date_epoch() -> int:
    """The time written into every archive entry we make: $SOURCE_DATE_EPOCH when set (reproducible-builds.org),
    else a fixed one, so the same inputs give the same bytes."""
    return max(int(os.environ.get("SOURCE_DATE_EPOCH", ZIP_EPOCH)), ZIP_EPOCH)
