"""The product speaks of the product: no tracked file (code, docs, tests, result files, their names) cites a numbered
working session or a diary. Measured decisions live in docs/decisions/, results of record in
docs/performance.md, history in git; every decision note a file cites exists."""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Joined from pieces so that this file does not match itself.
DIARY = re.compile("sess" + r"ions?[\s_-]?\d" + "|" + r"\bwork" + r"[\s_-]?log", re.IGNORECASE)
NOTE = re.compile(r"docs/decisions/(\d{4}-[a-z0-9-]+\.md)")


def tracked_files() -> list:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [name for name in out.decode().split("\0") if name]


def diary_references(name: str, data: bytes) -> list:
    """'file: name' when the file's name matches, 'file:line: text' for each matching line of a text file."""
    found = [f"{name}: (file name)"] if DIARY.search(name) else []
    if b"\0" in data:  # binary
        return found
    for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        if DIARY.search(line):
            found.append(f"{name}:{number}: {line.strip()[:120]}")
    return found


def test_the_pattern_finds_diary_references():
    bad = ("see " + "sess" + "ion 40", "Sess" + "ion17 results", "NVIDIA_models_" + "sess" + "ion39.md",
           "sess" + "ions 27-36", "the " + "work" + " log")
    assert all(DIARY.search(text) for text in bad)
    assert not any(DIARY.search(text) for text in ("a session of tests", "sessions", "network logic", "2 sessions"))
    assert diary_references("a.md", b"ok\nthe " + b"work" + b" log\n") == ["a.md:2: the " + "work" + " log"]
    assert diary_references("x_" + "sess" + "ion3.png", b"\0\x89PNG") == ["x_" + "sess" + "ion3.png: (file name)"]


def tracked_contents():
    for name in tracked_files():
        path = ROOT / name
        yield name, path.read_bytes() if path.is_file() else b""


def test_no_tracked_file_cites_a_session_or_a_work_log():
    found = [ref for name, data in tracked_contents() for ref in diary_references(name, data)]
    assert not found, "cite docs/decisions/ or docs/performance.md instead:\n" + "\n".join(found)


def test_cited_decision_notes_exist():
    notes = {path.name for path in (ROOT / "docs" / "decisions").glob("*.md")}
    missing = [f"{name}: {note}" for name, data in tracked_contents() if b"\0" not in data
               for note in NOTE.findall(data.decode("utf-8", errors="replace")) if note not in notes]
    assert not missing, "no such decision note:\n" + "\n".join(missing)
