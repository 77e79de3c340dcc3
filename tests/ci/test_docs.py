"""CI_WORKFLOW.md follows the code: every workflow named, the v1.0.0-sage3 asset list as variants/ computes it."""
import re

from scripts.ci import release_variants
from scripts.variants import ROOT
from tests.ci.workflows import WORKFLOWS

DOC = (ROOT / "CI_WORKFLOW.md").read_text()


def test_every_workflow_file_is_documented():
    for path in WORKFLOWS.glob("*.yml"):
        assert f".github/workflows/{path.name}" in DOC, path.name


def test_documented_assets_are_the_computed_ones():
    block = re.search(r"<!-- BEGIN v1.0.0-sage3 .*?-->\n```\n(.*?)```", DOC, re.DOTALL).group(1)
    assert block.split() == [v.wheel for v in release_variants("v1.0.0-sage3")]


def test_readme_points_to_the_ci_docs():
    assert "CI_WORKFLOW.md" in (ROOT / "README.md").read_text()
