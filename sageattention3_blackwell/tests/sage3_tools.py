"""Locating the CUDA binary tools the compile checks need."""
from __future__ import annotations

import os
import shutil
from pathlib import Path


def cuobjdump() -> str | None:
    """The CUDA toolkit's cuobjdump, else the copy shipped inside the triton package."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton
    except ImportError:
        return None
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(bundled) if os.access(bundled, os.X_OK) else None


def sass_mnemonics(cubin: bytes, tmp_path: Path) -> str:
    import subprocess
    tool = cuobjdump()
    path = tmp_path / "kernel.cubin"
    path.write_bytes(cubin)
    return subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True, check=True).stdout
