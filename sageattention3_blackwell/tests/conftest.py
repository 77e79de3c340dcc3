"""Makes the sageattn3 test helpers (sage3_*.py beside this file) importable under --import-mode=importlib."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
