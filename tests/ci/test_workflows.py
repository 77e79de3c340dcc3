"""The workflows as data: each trigger selects its profile, the jobs call the project's pixi tasks, releases only on tags."""
import copy
import re
import tomllib

import pytest

from scripts.ci import CIError
from scripts.variants import ROOT, load
from tests.ci.workflows import CALLERS, REUSABLE, WORKFLOWS, load_workflow, run, run_steps, triggered, uses_steps

# event, ref, dispatch choice -> (profile, release) for sage2 and sage3 workflows; None: the workflow doesn't start.
EXPECTED = [
    ("pull_request", "refs/pull/7/merge", "", ("default", False), ("default", False)),
    ("push", "refs/heads/main", "", ("stable", False), ("stable", False)),
    ("push", "refs/tags/v2.2.0", "", ("sage2-all", True), None),
    ("push", "refs/tags/v1.0.0-sage3", "", None, ("sage3-all", True)),
    ("push", "refs/heads/feature/x", "", None, None),
    ("workflow_dispatch", "refs/heads/main", "python312", ("python312", False), ("python312", False)),
    ("workflow_dispatch", "refs/tags/v1.0.0-sage3", "current", ("current", False), ("current", False)),
]


@pytest.fixture(scope="module")
def callers():
    return {name: load_workflow(WORKFLOWS / name) for name in CALLERS}


@pytest.fixture(scope="module")
def reusable():
    return load_workflow(REUSABLE)


def test_the_workflow_files_are_the_callers_and_the_shared_jobs():
    assert sorted(p.name for p in WORKFLOWS.glob("*.y*ml")) == sorted([*CALLERS, REUSABLE.name])


@pytest.mark.parametrize("name", CALLERS)
@pytest.mark.parametrize("event, ref, choice, sage2, sage3", EXPECTED)
def test_each_trigger_selects_its_profile(callers, name, event, ref, choice, sage2, sage3):
    decision = run(callers[name], event, ref, choice)
    expected = sage3 if CALLERS[name][0] == "sageattn3" else sage2
    assert (decision and (decision.profile, decision.release)) == expected


@pytest.mark.parametrize("name, tag", [("build-wheels-sage2-linux.yml", "v1.0.0-sage3"),
                                       ("build-wheels-sage3-windows.yml", "v2.2.0")])
def test_a_tag_filter_that_lets_the_other_packages_tag_through_is_caught(callers, name, tag):
    broken = copy.deepcopy(callers[name])
    broken["on"]["push"]["tags"] = ["v*"]
    with pytest.raises(CIError, match="this workflow's on.push.tags should exclude it"):
        run(broken, "push", f"refs/tags/{tag}")


def test_trigger_simulation_follows_github_filter_rules():
    on = {"push": {"branches": ["main"], "tags": ["v*", "!v*-sage3"]}}
    assert triggered(on, "push", "refs/tags/v2.2.0") and not triggered(on, "push", "refs/tags/v1.0.0-sage3")
    assert not triggered({"push": {"branches": ["main"]}}, "push", "refs/tags/v2.2.0")
    assert triggered({"push": None}, "push", "refs/tags/anything")
    assert not triggered(on, "pull_request", "refs/pull/1/merge")


@pytest.mark.parametrize("name", CALLERS)
def test_callers_pass_package_platform_runner_and_choice(callers, name):
    package, platform, runner = CALLERS[name]
    wf = callers[name]
    build = wf["jobs"]["build"]
    assert list(wf["jobs"]) == ["build"] and build["uses"] == f"./.github/workflows/{REUSABLE.name}"
    assert build["with"]["package"] == package and build["with"]["platform"] == platform
    assert build["with"]["runner"].startswith(runner)
    assert build["with"]["dispatch-profile"] == "${{ inputs.profile }}"
    assert build["secrets"] == {"PREFIX_API_KEY": "${{ secrets.PREFIX_API_KEY }}"}
    assert build["permissions"] == {"contents": "write", "pages": "write", "id-token": "write"}
    choice = wf["on"]["workflow_dispatch"]["inputs"]["profile"]
    # The choice list is a copy of variants/: keep the two the same.
    assert choice["type"] == "choice" and choice["default"] == "default"
    assert choice["options"] == list(load(package).profiles)


def test_reusable_inputs_match_what_callers_pass(reusable, callers):
    inputs = reusable["on"]["workflow_call"]["inputs"]
    for wf in callers.values():
        assert set(wf["jobs"]["build"]["with"]) == set(inputs)
    assert set(reusable["on"]["workflow_call"]["secrets"]) == {"PREFIX_API_KEY"}


def test_jobs_run_in_the_seed_order(reusable):
    jobs = reusable["jobs"]
    assert list(jobs) == ["validate", "generate-matrix", "build-wheels", "build-summary", "release", "pages"]
    needs = {name: set([job["needs"]] if isinstance(job.get("needs"), str) else job.get("needs", [])) for name, job in jobs.items()}
    assert needs["validate"] == set() and needs["generate-matrix"] == {"validate"}
    assert "generate-matrix" in needs["build-wheels"] and "build-wheels" in needs["build-summary"]
    assert {"validate", "build-wheels", "build-summary"} <= needs["release"]
    assert jobs["build-summary"]["if"].startswith("always()")


def _runs(job: dict) -> list[str]:
    return [step["run"] for step in job["steps"] if "run" in step]


def test_validate_decides_with_the_projects_profile_command(reusable):
    job = reusable["jobs"]["validate"]
    (step,) = [s for s in job["steps"] if s.get("run", "").startswith("pixi run ci-profile")]
    assert step["run"].startswith("pixi run ci-profile --package \"$PACKAGE\"") and "--github-output" in step["run"]
    assert step["env"]["DISPATCH_PROFILE"] == "${{ inputs.dispatch-profile }}"
    assert '--dispatch-profile="$DISPATCH_PROFILE"' in step["run"]  # one argument even when empty (not dispatched)
    assert job["outputs"] == {k: f"${{{{ steps.{step['id']}.outputs.{k} }}}}" for k in ("profile", "release")}


def test_generate_matrix_calls_the_projects_matrix_command(reusable):
    job = reusable["jobs"]["generate-matrix"]
    (step,) = [s for s in job["steps"] if "run" in s]
    assert re.fullmatch(r'pixi run matrix --package "\$PACKAGE" --profile "\$PROFILE" --platform "\$PLATFORM" '
                        r"--format json --github-output", step["run"])
    assert step["env"] == {"PACKAGE": "${{ inputs.package }}", "PROFILE": "${{ needs.validate.outputs.profile }}",
                           "PLATFORM": "${{ inputs.platform }}"}
    assert job["outputs"]["matrix"] == f"${{{{ steps.{step['id']}.outputs.matrix }}}}"


def test_build_wheels_is_one_job_per_variant_with_checks_and_artifacts(reusable):
    job = reusable["jobs"]["build-wheels"]
    assert job["strategy"] == {"fail-fast": False,
                               "matrix": {"include": "${{ fromJSON(needs.generate-matrix.outputs.matrix) }}"}}
    assert job["runs-on"] == "${{ inputs.runner }}" and job["env"]["VARIANT"] == "${{ matrix.name }}"
    runs = _runs(job)
    assert runs[0].startswith('pixi run build-variant --package "$PACKAGE" --profile "$PROFILE" --platform "$PLATFORM" '
                              '--variant "$VARIANT"')
    assert any(r.startswith("pixi run ci-check-build ") for r in runs)  # names and CUDA >= 12.8 for sageattn3
    (check,) = [r for r in runs if r.startswith("pixi run check-wheels ")]  # PEP 427 name, metadata, import
    assert "--no-install" not in check and '--python "$PYTHON"' in check
    # A CUDA torch of the wheel's version (PyTorch's index for its CUDA line): _C needs libc10_cuda to import.
    assert "--cuda-torch" in check and "whl/cpu" not in check
    uploads = [s["with"] for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert uploads[0]["name"] == "pkg-${{ matrix.name }}" and uploads[0]["if-no-files-found"] == "error"
    assert "dist/wheels/*.whl" in uploads[0]["path"] and "dist/channel/*/*.conda" in uploads[0]["path"]


def test_build_wheels_checks_symbols_and_skips_wheel_steps_for_conda_only_rows(reusable):
    steps = {s["run"].split()[2]: s for s in reusable["jobs"]["build-wheels"]["steps"] if "run" in s}
    # Every torch symbol the compiled modules need is in the PyPI torch wheel they require (Linux ELF modules).
    assert steps["symbol-check"]["run"] == "pixi run symbol-check dist/wheels/*.whl"
    assert steps["symbol-check"]["if"] == "matrix.wheel && inputs.platform != 'win-64'"
    # A row whose PyPI torch has the other C++ ABI has no wheel (matrix.wheel is null): nothing to check or install.
    assert steps["check-wheels"]["if"] == "matrix.wheel"


def test_build_summary_tables_the_profile(reusable):
    assert any(r.startswith("pixi run ci-summary ") for r in _runs(reusable["jobs"]["build-summary"]))


def release_problems(job: dict) -> list[str]:
    """What keeps a release job from running only on this package's release tags."""
    found = []
    if job.get("if") != "needs.validate.outputs.release == 'true'":
        found.append(f"release runs on `{job.get('if')}`, not only when validate says the tag is a release")
    if job.get("permissions") != {"contents": "write"}:
        found.append("release needs contents: write and nothing more")
    runs = _runs(job)
    if not any(r.startswith('pixi run ci-release --tag "$TAG" --platform "$PLATFORM"') for r in runs):
        found.append("release does not run pixi run ci-release")
    if not any(r.startswith("pixi run ci-upload-channel") for r in runs):
        found.append("release does not upload to the conda channel")
    return found


def test_release_runs_only_on_release_tags(reusable):
    job = reusable["jobs"]["release"]
    assert release_problems(job) == []
    assert job["env"]["TAG"] == "${{ github.ref_name }}"
    secrets = [s["env"]["PREFIX_API_KEY"] for s in job["steps"] if "PREFIX_API_KEY" in s.get("env", {})]
    assert secrets == ["${{ secrets.PREFIX_API_KEY }}"]
    loose = copy.deepcopy(job)
    loose["if"] = "startsWith(github.ref, 'refs/tags/v')"
    assert len(release_problems(loose)) == 1


def test_run_steps_only_call_pixi_tasks_that_exist():
    manifest = tomllib.loads((ROOT / "pixi.toml").read_text())
    tasks = {name for feature in manifest["feature"].values() for name in feature.get("tasks", {})}
    for path in WORKFLOWS.glob("*.yml"):
        for job, step in run_steps(load_workflow(path)):
            # One line each, no shell logic: decisions belong in scripts/ where the tests reach them.
            assert re.fullmatch(r"pixi run [a-z0-9-]+( [^\n;&|`]*)?", step["run"].strip()), (path.name, job, step["run"])
            assert step["run"].split()[2] in tasks, (path.name, job, step["run"])


def test_actions_are_pinned():
    pixi_versions, setup_pixi = set(), set()
    for path in WORKFLOWS.glob("*.yml"):
        for step in uses_steps(load_workflow(path)):
            action, _, version = step["uses"].partition("@")
            assert re.fullmatch(r"v\d+(\.\d+\.\d+)?", version), step["uses"]
            if action == "prefix-dev/setup-pixi":
                setup_pixi.add(version)
                pixi_versions.add(step["with"]["pixi-version"])
            elif action in ("actions/checkout", "actions/upload-artifact", "actions/download-artifact"):
                assert version == "v4", step["uses"]
    assert len(setup_pixi) == 1 and re.fullmatch(r"v\d+\.\d+\.\d+", setup_pixi.pop())
    assert len(pixi_versions) == 1 and re.fullmatch(r"v\d+\.\d+\.\d+", pixi_versions.pop())


def test_pages_publishes_the_pip_indexes_after_a_release(reusable):
    job = reusable["jobs"]["pages"]
    assert job["if"] == "needs.validate.outputs.release == 'true'" and "release" in job["needs"]
    assert job["permissions"] == {"contents": "read", "pages": "write", "id-token": "write"}
    assert job["concurrency"] == {"group": "github-pages", "cancel-in-progress": False}  # deployments in turn
    (run,) = _runs(job)
    assert run == 'pixi run ci-pages --out site --site-url "$SITE_URL"'
    uses = [s["uses"].split("@")[0] for s in job["steps"] if "uses" in s]
    assert uses[-3:] == ["actions/configure-pages", "actions/upload-pages-artifact", "actions/deploy-pages"]


def test_validate_uploads_the_pixi_lock_it_solved(reusable):
    steps = reusable["jobs"]["validate"]["steps"]
    assert "pixi run lock" in _runs(reusable["jobs"]["validate"])
    (upload,) = [s["with"] for s in steps if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert upload["path"] == "pixi.lock" and upload["if-no-files-found"] == "error"
