"""Make the repo's scripts/ package importable however pytest is started (plain `pytest` adds no cwd)."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
