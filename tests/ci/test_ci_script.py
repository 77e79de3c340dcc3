"""scripts/ci.py: profiles per trigger, release assets from variants/, checks of build outputs, release and channel upload."""
import dataclasses
import json
import os
import shutil
import sys

import pytest
from packaging.utils import parse_wheel_filename

from scripts import ci, matrix, wheel_check, wheel_export
from scripts.ci import CIError, decide, main, release_variants
from scripts.variants import ROOT, load
from scripts.wheel_names import Flavour, is_wheel_named
from tests.ci.stand_ins import python_tool

# The v1.0.0-sage3 release: 8 Linux + 8 Windows wheels, torch 2.7/2.8 × Python 3.10-3.13. The build tags are
# what conda-forge builds against (BUILD_MATRIX.md): Linux 2.7 uses torch 2.7.1 + CUDA 12.9 (270.129),
# Windows 2.8 uses CUDA 12.8 (280.128); the seed document's names assumed 270.128 and 280.129 everywhere.
SAGE3_V100 = [f"sageattn3-1.0.0-{tag}-cp{py}-cp{py}-{plat}.whl"
              for plat, tags in (("linux_x86_64", ("270.129", "280.129")), ("linux_aarch64", ("270.129", "280.129")),
                                 ("win_amd64", ("270.128", "280.128")))
              for tag in tags for py in ("310", "311", "312", "313")]


@pytest.mark.parametrize("package", ["sageattention", "sageattn3"])
def test_profiles_per_trigger(package):
    assert decide(package, "pull_request", "refs/pull/3/merge").profile == "default"
    assert decide(package, "push", "refs/heads/main").profile == "stable"
    assert decide(package, "workflow_dispatch", "refs/heads/main", "pytorch28") == \
        ci.Decision("pytorch28", False, "manual run: the chosen profile")
    assert not any(decide(package, e, r, "stable").release for e, r in
                   [("pull_request", "refs/pull/3/merge"), ("push", "refs/heads/main"), ("workflow_dispatch", "refs/tags/v2.2.0")])
    for profile in ("default", "stable", ci.RELEASES[package].profile):
        assert profile in load(package).profiles


def test_release_tags_select_all_and_release():
    assert decide("sageattn3", "push", "refs/tags/v1.0.0-sage3") == \
        ci.Decision("sage3-all", True, "release tag v1.0.0-sage3: sage3-all, then a release")
    assert decide("sageattention", "push", "refs/tags/v2.2.0") == \
        ci.Decision("sage2-all", True, "release tag v2.2.0: sage2-all, then a release")


@pytest.mark.parametrize("package, event, ref, choice, message", [
    ("sageattention", "push", "refs/tags/v1.0.0-sage3", "", "releases sageattn3, not sageattention"),
    ("sageattn3", "push", "refs/tags/v2.2.0", "", "releases sageattention, not sageattn3"),
    ("sageattn3", "push", "refs/tags/v1.0.1-sage3", "", "says sageattn3 1.0.1, but the sources build sageattn3 1.0.0"),
    ("sageattention", "push", "refs/tags/nightly", "", "'nightly' is not a release tag"),
    ("sageattention", "push", "refs/tags/vnext", "", "'vnext' is not a release tag"),
    ("sageattn3", "workflow_dispatch", "refs/heads/main", "sage2-all", "unknown profile 'sage2-all' for sageattn3"),
    ("sageattn3", "push", "refs/heads/dev", "", "no profile for event 'push' on 'refs/heads/dev'"),
    ("sageattn3", "schedule", "refs/heads/main", "", "no profile for event 'schedule'"),
])
def test_wrong_runs_stop_with_a_reason(package, event, ref, choice, message):
    with pytest.raises(CIError, match=message.replace(".", r"\.")):
        decide(package, event, ref, choice)


def test_profile_command_writes_step_outputs(tmp_path, monkeypatch, capsys):
    out = tmp_path / "github_output"
    monkeypatch.setenv("GITHUB_OUTPUT", str(out))
    monkeypatch.setenv("GITHUB_EVENT_NAME", "push")
    monkeypatch.setenv("GITHUB_REF", "refs/tags/v1.0.0-sage3")
    assert main(["profile", "--package", "sageattn3", "--github-output"]) == 0
    assert out.read_text() == "profile=sage3-all\nrelease=true\n"
    assert main(["profile", "--package", "sageattention", "--github-output"]) == 2
    assert "releases sageattn3, not sageattention" in capsys.readouterr().err


def test_matrix_github_output_is_one_line_json_with_a_count(tmp_path, monkeypatch):
    out = tmp_path / "github_output"
    monkeypatch.setenv("GITHUB_OUTPUT", str(out))
    assert matrix.main(["--package", "sageattn3", "--profile", "sage3-all", "--platform", "win-64",
                        "--format", "json", "--github-output"]) == 0
    lines = out.read_text().splitlines()
    assert lines[0].startswith("matrix=") and lines[1] == "count=8"
    rows = json.loads(lines[0].removeprefix("matrix="))
    assert {r["platform"] for r in rows} == {"win-64"} and len({r["name"] for r in rows}) == 8


def test_v1_0_0_sage3_releases_24_wheels_computed_from_variants(capsys):
    names = [v.wheel for v in release_variants("v1.0.0-sage3")]
    assert names == SAGE3_V100
    assert [sum(n.endswith(f"{p}.whl") for n in names) for p in ("linux_x86_64", "linux_aarch64", "win_amd64")] == [8] * 3
    for name in names:  # PEP 427, with a build tag
        dist, version, build, tags = parse_wheel_filename(name)
        assert (dist, str(version)) == ("sageattn3", "1.0.0") and build and len(tags) == 1
    assert main(["release-assets", "--tag", "v1.0.0-sage3"]) == 0
    assert capsys.readouterr().out.split() == SAGE3_V100
    assert len(release_variants("v2.2.0", "linux-64")) == len(load("sageattention").select("sage2-all", "linux-64"))


def test_manylinux_stands_for_linux_x86_64_and_nothing_else():
    want = "sageattn3-1.0.0-280.129-cp312-cp312-linux_x86_64.whl"
    assert is_wheel_named(want, want)
    assert is_wheel_named(want, "sageattn3-1.0.0-280.129-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")
    for other in ("sageattn3-1.0.0-280.128-cp312-cp312-linux_x86_64.whl", "sageattn3-1.0.0-280.129-cp313-cp313-linux_x86_64.whl",
                  "sageattn3-1.0.0-280.129-cp312-cp312-manylinux_2_17_aarch64.whl", "sageattn3-1.0.1-280.129-cp312-cp312-linux_x86_64.whl",
                  "sageattn3-1.0.0-cp312-cp312-linux_x86_64.whl", "not-a-wheel.whl"):
        assert not is_wheel_named(want, other), other
    assert not is_wheel_named("sageattn3-1.0.0-280.128-cp312-cp312-win_amd64.whl",
                              "sageattn3-1.0.0-280.128-cp312-cp312-manylinux_2_17_x86_64.whl")


def fake_dist(root, variants, manylinux=True):
    """Empty files named like one CI build per variant: dist/wheels/*.whl and dist/channel/<platform>/*.conda."""
    for v in variants:
        wheel = v.wheel.replace("linux_x86_64", "manylinux_2_17_x86_64") if manylinux else v.wheel
        (root / "wheels").mkdir(parents=True, exist_ok=True)
        (root / "wheels" / wheel).touch()
        (root / "channel" / v.platform).mkdir(parents=True, exist_ok=True)
        (root / "channel" / v.platform / f"{v.package}-{v.version}-{v.build_string_prefix}h1a2b3c4_0.conda").touch()
    return root


def test_check_build_finds_the_variants_outputs(tmp_path, capsys):
    v = load("sageattn3").select("default", "linux-64")[0]
    dist = fake_dist(tmp_path / "dist", [v])
    assert main(["check-build", "--package", "sageattn3", "--variant", v.name, str(dist)]) == 0
    (dist / "wheels" / v.wheel.replace("linux_x86_64", "manylinux_2_17_x86_64")).unlink()
    assert main(["check-build", "--package", "sageattn3", "--variant", v.name, str(dist)]) == 1
    assert f"expected one wheel named {v.wheel}, found 0" in capsys.readouterr().err
    assert main(["check-build", "--package", "sageattn3", "--variant", "linux-sage3-pytorch99", str(dist)]) == 2


def test_check_build_counts_the_index_copy_of_a_wheel_once(tmp_path):
    """The build driver publishes each wheel again under the pip index's files/ (scripts/index_pages.py)."""
    v = load("sageattn3").select("default", "linux-64")[0]
    dist = fake_dist(tmp_path / "dist", [v])
    (wheel,) = (dist / "wheels").iterdir()
    (dist / "index" / "files").mkdir(parents=True)
    shutil.copy(wheel, dist / "index" / "files")
    assert ci.outputs(v, dist)[0] == [wheel] and ci.build_problems(v, dist) == []


def test_check_build_enforces_cuda_12_8_for_sageattn3(tmp_path):
    old = dataclasses.replace(load("sageattn3").select("default", "linux-64")[0], cuda="12.6")
    dist = fake_dist(tmp_path / "dist", [old], manylinux=False)
    assert ci.build_problems(old, dist) == [
        f"{old.wheel}: Sage3 is only supported on CUDA 12.8 and above (this wheel is built for CUDA 12.6)"]
    sage2 = dataclasses.replace(load("sageattention").select("default", "linux-64")[0], cuda="12.6")
    assert ci.build_problems(sage2, fake_dist(tmp_path / "sage2", [sage2], manylinux=False)) == []


def test_summary_tables_every_variant_and_fails_on_a_missing_one(tmp_path, monkeypatch, capsys):
    variants = load("sageattn3").select("stable", "win-64")
    dist = fake_dist(tmp_path / "dist", variants[:1])
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert main(["summary", "--package", "sageattn3", "--profile", "stable", "--platform", "win-64", str(dist)]) == 1
    text = summary.read_text()
    assert text.startswith("### sageattn3 · profile `stable` · win-64")
    assert f"| {variants[0].name} | " in text and f"`{variants[0].wheel}`" in text and "| ok |" in text
    assert f"| {variants[1].name} | " in text and "| missing | missing | FAILED: expected one wheel" in text
    fake_dist(dist, variants[1:])
    assert main(["summary", "--package", "sageattn3", "--profile", "stable", "--platform", "win-64", str(dist)]) == 0


def test_release_assets_check_wants_exactly_the_tags_builds(tmp_path, capsys):
    linux = release_variants("v1.0.0-sage3", "linux-64")
    dist = fake_dist(tmp_path / "dist", linux)
    assert main(["release-assets", "--tag", "v1.0.0-sage3", "--platform", "linux-64", "--check", str(dist)]) == 0
    assert len(capsys.readouterr().out.split()) == 16  # 8 wheels + 8 conda packages
    (dist / "wheels" / "sageattn3-1.0.0-290.129-cp312-cp312-linux_x86_64.whl").touch()
    next((dist / "channel" / "linux-64").glob(f"*{linux[0].build_string_prefix}*.conda")).unlink()
    assert main(["release-assets", "--tag", "v1.0.0-sage3", "--platform", "linux-64", "--check", str(dist)]) == 2
    err = capsys.readouterr().err
    assert "unexpected wheel sageattn3-1.0.0-290.129-cp312-cp312-linux_x86_64.whl" in err
    assert f"{linux[0].name}: expected one conda package" in err


FAKE_GH = """\
import json, os, sys
state = os.environ["FAKE_GH_STATE"]
data = json.load(open(state))
data["calls"].append(sys.argv[1:])
verb = sys.argv[2]
code = 0
if verb == "view":
    code = 0 if data["exists"] else 1
elif verb == "create":
    code = 1 if data["race"] else 0   # the other workflow created it a moment ago
    data["exists"] = True
    data["notes"] = open(sys.argv[sys.argv.index("--notes-file") + 1]).read()
json.dump(data, open(state, "w"))
sys.exit(code)
"""


@pytest.fixture
def gh(tmp_path, monkeypatch):
    """A stand-in `gh` that records its calls; returns (path, state file)."""
    script = python_tool(tmp_path, "gh", FAKE_GH)
    state = tmp_path / "gh-state.json"
    monkeypatch.setenv("FAKE_GH_STATE", str(state))

    def make(exists, race=False):
        state.write_text(json.dumps({"exists": exists, "race": race, "calls": []}))
        return str(script), state
    return make


@pytest.mark.parametrize("exists, race, verbs", [
    (False, False, ["view", "create", "upload"]),         # first platform to finish creates
    (True, False, ["view", "upload"]),                    # the other appends
    (False, True, ["view", "create", "view", "upload"]),  # both raced to create: the loser appends
])
def test_release_creates_if_missing_then_uploads(tmp_path, gh, exists, race, verbs):
    path, state = gh(exists, race)
    dist = fake_dist(tmp_path / "dist", release_variants("v1.0.0-sage3", "win-64"))
    files = ci.publish("v1.0.0-sage3", "win-64", dist, gh=path)
    calls = json.loads(state.read_text())["calls"]
    assert [c[1] for c in calls] == verbs
    upload = calls[-1]
    assert upload[:4] == ["release", "upload", "v1.0.0-sage3", "--clobber"] and upload[4:] == [str(f) for f in files]
    assert sorted(f.name for f in files if f.suffix == ".whl") == sorted(w for w in SAGE3_V100 if "win_amd64" in w)
    if "create" in verbs:
        create = next(c for c in calls if c[1] == "create")
        assert "--verify-tag" in create and create[create.index("--title") + 1] == "sageattn3 1.0.0"
        assert json.loads(state.read_text())["notes"] == ci.release_notes("v1.0.0-sage3")


def test_release_notes_list_both_platforms():
    notes = ci.release_notes("v1.0.0-sage3")
    assert notes.count("| linux-64 |") == 8 and notes.count("| win-64 |") == 8
    assert "conda install -c https://repo.prefix.dev/sageattention -c conda-forge sageattn3" in notes


def test_release_refuses_incomplete_assets_before_touching_github(tmp_path, gh):
    path, state = gh(False)
    dist = fake_dist(tmp_path / "dist", release_variants("v1.0.0-sage3", "linux-64")[:7])
    with pytest.raises(CIError, match="release assets incomplete"):
        ci.publish("v1.0.0-sage3", "linux-64", dist, gh=path)
    assert json.loads(state.read_text())["calls"] == []


def test_channel_upload_is_skipped_with_a_notice_without_a_key(tmp_path, monkeypatch, capsys):
    dist = fake_dist(tmp_path / "dist", load("sageattn3").select("default", "linux-64"))
    monkeypatch.delenv("PREFIX_API_KEY", raising=False)
    monkeypatch.setattr(ci.shutil, "which", lambda name: pytest.fail("must not look for rattler-build"))
    assert main(["upload-channel", "--channel", "sage", str(dist)]) == 0
    assert capsys.readouterr().out.startswith("::notice title=conda channel::PREFIX_API_KEY is not set: 1 packages")


def test_channel_upload_calls_rattler_build_with_the_key_in_the_environment(tmp_path, monkeypatch):
    dist = fake_dist(tmp_path / "dist", load("sageattn3").select("default", "linux-64"))
    log = tmp_path / "calls.json"
    cli = tmp_path / "rattler-build"
    cli.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                   f"json.dump([sys.argv[1:], os.environ['PREFIX_API_KEY']], open({str(log)!r}, 'w'))\n")
    cli.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PREFIX_API_KEY", "pfx-secret")
    monkeypatch.setenv("PREFIX_CHANNEL", "")
    assert ci.upload_channel(dist, ci.DEFAULT_CHANNEL) == 0
    argv, key = json.loads(log.read_text())
    assert argv[:5] == ["upload", "prefix", "--channel", "sageattention", "--skip-existing"]
    assert argv[5].endswith(".conda") and key == "pfx-secret" and "pfx-secret" not in argv


def test_check_wheels_imports_in_the_variants_python(tmp_path, monkeypatch):
    # build-wheels runs `check-wheels --python <the variant's Python>`: every wheel is installed there, even
    # one this interpreter couldn't take (here a Windows wheel), with the extra index passed on to pip.
    init = tmp_path / "__init__.py"
    init.touch()
    wheel = wheel_export._write(tmp_path, {"name": "sageattn3"}, {}, Flavour("12.8", "2.8", "3.12"), "1.0.0",
                                {"sageattn3/__init__.py": init}, "win_amd64", ["torch==2.8.*"],
                                {"LICENSE": ROOT / "LICENSE"})
    calls = []
    monkeypatch.setattr(wheel_check, "install_and_import", lambda *args: calls.append(args) or (True, "torch"))
    mirror = "https://mirror.example/simple"
    assert wheel_check.main([str(wheel), "--python", "/opt/py312/bin/python", "--extra-index-url", mirror,
                             "--cuda-torch"]) == 0
    assert calls == [(wheel, ["--extra-index-url", mirror], False, "/opt/py312/bin/python", True)]
    assert wheel_check.main([str(wheel), "--extra-index-url", mirror]) == 0 and len(calls) == 1  # not installable here
