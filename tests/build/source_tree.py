"""The files a source build of sageattention sees (its sdist's): the root's files, the package, the kernel sources,
and what it shares with sageattn3 from sageattention3_blackwell/ (the build support and torch_binding.h)."""
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ["sageattention3_blackwell/build_support.py", "sageattention3_blackwell/cuda_setup.py",
           "sageattention3_blackwell/csrc/torch_binding.h"]


def copy_sources(where: Path) -> Path:
    for item in ROOT.iterdir():
        if item.is_file():
            shutil.copy2(item, where / item.name)
    for folder in ("sageattention", "csrc"):
        shutil.copytree(ROOT / folder, where / folder, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    for name in SUPPORT:
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, where / name)
    return where
