"""Puts the repository root on sys.path, so that `scripts` and `tests.*` import under --import-mode=importlib.

Imports nothing heavy: the tooling tests (tests/ci, tests/distribution, tests/rehearsal, tests/build) run
without torch or Triton; sageattention's own setup is in tests/sageattention/conftest.py.
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
