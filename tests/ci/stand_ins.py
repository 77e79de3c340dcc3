"""Stand-in command-line tools for the CI tests."""
import sys
from pathlib import Path


def python_tool(where: Path, name: str, body: str) -> Path:
    """An executable `where/name` that runs `body` with this interpreter."""
    script = where / name
    script.write_text(f"#!{sys.executable}\n{body}")
    script.chmod(0o755)
    return script
