"""BUILD_MATRIX.md is generated from variants/ and must match it."""
from scripts.build_matrix_doc import TARGET, main, render


def test_build_matrix_md_is_in_sync_with_variants():
    assert main(["--check"]) == 0, "run: python -m scripts.build_matrix_doc --write"


def test_generated_doc_shows_substitutes_and_unavailable_rows():
    text = render()
    assert text == TARGET.read_text()
    assert "| linux-64 | 2.7.0 | 12.8.1 | torch 2.7.1 + CUDA 12.9 (substitute) | 3.10, 3.11, 3.12, 3.13 | 270.129 |" in text
    assert "win-64: torch 2.10.0 + CUDA 13.0 (Python 3.10, 3.11, 3.12, 3.13, 3.14): conda-forge has no CUDA 13" in text
    assert "| `sage3-all` | Every seed row | 8 | 8 |" in text
    assert "| 280.129 | 2.8 | 12.9 |" in text


def test_check_notices_a_stale_file(tmp_path, monkeypatch):
    stale = tmp_path / "BUILD_MATRIX.md"
    stale.write_text(render().replace("280.129", "999.999"))
    monkeypatch.setattr("scripts.build_matrix_doc.TARGET", stale)
    assert main(["--check"]) == 1
