"""Real pip against our published indexes, served by `python -m http.server` on 127.0.0.1 beside a stand-in PyPI
(torch, triton and PyPI's unrelated `sageattention` 1.0.6): the helper and the documented command install the build
for the installed torch and leave torch alone; a wrong index, a Python we don't build for and the unpinned form are
refused with the reason, torch untouched, and never end in PyPI's 1.0.6. One flat folder can't pick by torch."""
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import urllib.parse
import urllib.request

import pytest

from scripts.index_pages import write_indexes
from scripts.variants import ROOT
from tests.distribution.helpers import fresh_venv, http_server, pip, run_py, simple_index, stub_torch, stub_wheel

FLAVOUR = "import sageattn3, torch; print(sageattn3.FLAVOUR, torch.__version__)"
TORCH = "import torch; print(torch.__version__)"
# The installed torch (version, torch.version.cuda) -> the build that must be installed, and how. PyPI's torch 2.7
# is a CUDA 12.6 build and its 2.8 one CUDA 12.8: both take our CUDA 12.9 builds (one index per CUDA major).
# PyTorch's own index names its builds with a local version (2.7.0+cu126); the helper pins exactly that.
PAIRS = [("2.7.0+cu126", "12.6", "cu12.9torch2.7", "helper"), ("2.8.0", "12.8", "cu12.9torch2.8", "command"),
         ("2.10.0", "13.0", "cu13.0torch2.10", "helper")]
SITE_IN_DOCS = "https://<owner>.github.io/<repo>"
# Our sageattention, built only for a Python nobody runs: on this index no wheel fits this interpreter.
ELSEWHERE = ("cp399-cp399-linux_x86_64", ">=3.99,<3.100")


def docs_line(prefix: str) -> str:
    text = (ROOT / "docs" / "installing.md").read_text()
    return re.search(rf"^({re.escape(prefix)}.*)$", text, re.MULTILINE).group(1)


def documented_command(site, package="sageattn3", version="1.0.0", index="cu12-torch2.8", torch="2.8") -> list[str]:
    """The pip command docs/installing.md gives for typing by hand, for another package, index or torch."""
    line = docs_line("pip install sageattn3==").replace(SITE_IN_DOCS, site)
    line = line.replace("sageattn3==1.0.0", f"{package}=={version}").replace("cu12-torch2.8", index)
    return shlex.split(line.replace('"torch==2.8.*"', f'"torch=={torch}.*"'))[2:]


@pytest.fixture(scope="module")
def served(wheels, tmp_path_factory):
    """Everything on one loopback server: our site (the exported sageattn3 wheels and an sageattention for another
    Python, published under site/) and a stand-in PyPI (pypi/)."""
    root = tmp_path_factory.mktemp("served")
    made = tmp_path_factory.mktemp("made")
    torches = [stub_torch(made, version, cuda) for version, cuda, _, _ in PAIRS]
    pypi = [*torches, stub_torch(made, "2.6.0", "12.6"), stub_wheel(made, "triton", "3.4.0"),
            stub_wheel(made, "sageattention", "1.0.6", "UNRELATED = True\n")]
    simple_index(root / "pypi", pypi)
    ours = [*wheels.values(), stub_wheel(made, "sageattention", "2.2.0", tag=ELSEWHERE[0], build="280.129",
                                         requires_python=ELSEWHERE[1])]
    with http_server(root) as url:
        write_indexes(dict.fromkeys(ours), root / "site", site_url=f"{url}/site")
        yield url, root


def env_for(url):
    """pip's configuration for the helper: the stand-in PyPI as the default index, bounded network waits."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {**keep, "PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": f"{url}/pypi/", "PIP_TIMEOUT": "10",
            "PIP_RETRIES": "0", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def pip_from(python, url, *args):
    return pip(python, "install", "--index-url", f"{url}/pypi/", "--timeout", "10", "--retries", "0", *args)


def helper(python, url, package="sageattn3", *extra):
    """`python sage_install.py PACKAGE` as docs/installing.md gives it, run on the copy the site publishes."""
    assert docs_line("python sage_install.py sageattn3").startswith("python sage_install.py sageattn3")
    path = fetch_to(f"{url}/site/sage_install.py", python.parent.parent / "sage_install.py")
    return subprocess.run([str(python), str(path), package, *extra], capture_output=True, text=True,
                          env=env_for(url), check=False)


def fetch_to(url, path):
    with urllib.request.urlopen(url, timeout=10) as response:
        path.write_bytes(response.read())
    return path


def venv_with_torch(where, url, version):
    python = fresh_venv(where)
    assert pip_from(python, url, f"torch=={version}", "triton").returncode == 0
    return python


@pytest.fixture(scope="module")
def torch28(served, tmp_path_factory):
    """A venv with torch 2.8.0, shared by the refusals: each checks that it leaves the venv as it was."""
    return venv_with_torch(tmp_path_factory.mktemp("torch28") / "venv", served[0], "2.8.0")


def nothing_changed(python):
    assert run_py(python, TORCH) == "2.8.0"
    assert run_py(python, "import importlib.util as u; print(u.find_spec('sageattn3'), u.find_spec('sageattention'))") \
        == "None None"


def test_every_link_stays_inside_the_published_folder(served):
    url, root = served
    site = f"{url}/site/"
    assert json.loads(urllib.request.urlopen(f"{site}indexes.json", timeout=10).read()) == {
        "cu12-torch2.7": {"sageattn3": ["1.0.0"]}, "cu12-torch2.8": {"sageattention": ["2.2.0"], "sageattn3": ["1.0.0"]},
        "cu13-torch2.10": {"sageattn3": ["1.0.0"]}}
    pages = [f"{site}{p.relative_to(root / 'site').parent.as_posix()}/" for p in (root / "site").rglob("*/index.html")]
    assert len(pages) == 3 + 4  # one page per index, one per project on it
    for page in pages:
        found = re.findall(r'href="([^"#]+)', urllib.request.urlopen(page, timeout=10).read().decode())
        for href in found:
            target = urllib.parse.urljoin(page, href)
            assert target.startswith(site), (page, href)
            assert urllib.request.urlopen(target, timeout=10).status == 200
    page = (root / "site/cu12-torch2.8/simple/sageattn3/index.html").read_text()
    (wheel,) = [w for w in (root / "site/files").glob("sageattn3-*.whl") if "-280.129-" in w.name]
    assert f'href="../../../files/{wheel.name}#sha256=' in page and 'data-requires-python="&gt;=' in page
    assert 'href="sageattn3-1.0.0.tar.gz#sha256=' in page  # the guard
    assert "-270.129-" not in page and "-2100.130-" not in page
    assert f"SITE = {url + '/site'!r}" in (root / "site/sage_install.py").read_text()


def test_one_flat_folder_only_offers_pip_the_highest_build_tag(wheels, served, tmp_path):
    url, _ = served
    flat = tmp_path / "v1.0.0-sage3"
    flat.mkdir()
    for wheel in wheels.values():
        shutil.copy(wheel, flat)
    python = venv_with_torch(tmp_path / "venv", url, "2.7.0")
    # pip keeps one file per version (the highest build tag, 2100.130) and never tries the 270.129 build
    # that fits the installed torch: offline it fails, and where another torch is on offer it swaps torch.
    proc = pip(python, "install", "--no-index", "-f", str(flat), "sageattn3")
    assert proc.returncode != 0 and "torch==2.10.*" in proc.stderr
    proc = pip_from(python, url, "-f", str(flat), "sageattn3")
    assert proc.returncode == 0, proc.stderr
    assert run_py(python, FLAVOUR) == "cu13.0torch2.10 2.10.0"


@pytest.mark.parametrize("torch, cuda, flavour, via", PAIRS)
def test_our_build_for_the_installed_torch_is_installed_and_torch_kept(served, tmp_path, torch, cuda, flavour, via):
    url, _ = served
    python = venv_with_torch(tmp_path / "venv", url, torch)
    index = f"cu{cuda.split('.')[0]}-torch{torch.rsplit('.', 1)[0]}"
    if via == "helper":
        proc = helper(python, url)
        assert f"pip install sageattn3==1.0.0 torch=={torch} --extra-index-url {url}/site/{index}/simple" in proc.stdout
    else:
        proc = pip_from(python, url, *documented_command(f"{url}/site", index=index, torch=torch.rsplit(".", 1)[0]))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert run_py(python, FLAVOUR) == f"{flavour} {torch}"  # the matching wheel, the same torch


def test_a_wrong_index_is_refused_and_torch_kept(served, torch28):
    url, _ = served
    # The documented command with torch 2.7's index: pip refuses instead of swapping torch...
    proc = pip_from(torch28, url, *documented_command(f"{url}/site", index="cu12-torch2.7"))
    assert proc.returncode != 0
    assert "Cannot install sageattn3==1.0.0 and torch==2.8.* because" in proc.stderr
    assert "The user requested torch==2.8.*" in proc.stdout and "sageattn3 1.0.0 depends on torch==2.7.*" in proc.stdout
    nothing_changed(torch28)
    # ...which it would do without the torch pin.
    unpinned = [a for a in documented_command(f"{url}/site", index="cu12-torch2.7") if not a.startswith("torch==")]
    proc = pip_from(torch28, url, "--dry-run", *unpinned)
    assert "Would install sageattn3-1.0.0 torch-2.7.0" in proc.stdout, proc.stdout + proc.stderr


def test_a_python_we_dont_build_for_gets_the_reason(served, torch28):
    url, _ = served
    # This interpreter in the helper's words (scripts/sage_install.py imports torch, which tooling tests must not).
    python = f"{platform.python_implementation()} {sys.version_info.major}.{sys.version_info.minor}"
    reason = (f"error: the index cu12-torch2.8 has no sageattention wheel for {python} on {sysconfig.get_platform()}, "
              "only for CPython 3.99 on linux-x86_64")
    proc = helper(torch28, url, "sageattention")
    assert proc.returncode == 1 and proc.stderr.strip() == reason
    proc = pip_from(torch28, url, *documented_command(f"{url}/site", "sageattention", "2.2.0"))
    assert proc.returncode != 0 and reason in proc.stdout + proc.stderr
    nothing_changed(torch28)


def test_the_unpinned_form_never_installs_pypis_sageattention(served, torch28):
    url, _ = served
    unpinned = ["sageattention", "--extra-index-url", f"{url}/site/cu12-torch2.8/simple"]
    proc = pip_from(torch28, url, *unpinned)
    assert proc.returncode != 0 and "has no sageattention wheel for" in proc.stdout + proc.stderr
    nothing_changed(torch28)
    # Without our index the same name is PyPI's unrelated 1.0.6.
    assert "Would install sageattention-1.0.6" in pip_from(torch28, url, "--dry-run", "sageattention").stdout


@pytest.mark.parametrize("torch, cuda, message", [
    ("2.6.0", "12.6", "error: no sageattn3 wheels for torch 2.6 with CUDA 12.x; sageattn3 is built for torch 2.7 "
                      "with CUDA 12.x, torch 2.8 with CUDA 12.x, torch 2.10 with CUDA 13.x"),
    ("2.8.0", None, "error: torch 2.8.0 is a CPU build; our wheels need a CUDA build of torch"),
])
def test_without_a_matching_build_the_helper_says_what_we_build_for(served, tmp_path, torch, cuda, message):
    url, _ = served
    # The helper stops before pip runs, so a stand-in torch on the path does (no venv needed).
    stub = stub_torch(tmp_path, torch, cuda)
    subprocess.run([sys.executable, "-m", "zipfile", "-e", str(stub), str(tmp_path / "path")], check=True)
    fetch_to(f"{url}/site/sage_install.py", tmp_path / "sage_install.py")
    proc = subprocess.run([sys.executable, str(tmp_path / "sage_install.py"), "sageattn3"], capture_output=True,
                          text=True, env={**env_for(url), "PYTHONPATH": str(tmp_path / "path")}, check=False)
    assert proc.returncode == 1 and proc.stderr.strip() == message
