"""The stand-in channel: the real recipes solve against it, and what it installs works on this machine."""
import dataclasses
import subprocess

import pytest

from scripts import standin_channel
from scripts.rehearse import chosen_variants
from scripts.render import render
from tests.rehearsal.conftest import cuda_home, install, pypi_tree, solve


def names(records):
    return {r.name.normalized: r for r in records}


@pytest.mark.parametrize("package", ["sageattention", "sageattn3"])
def test_the_recipes_build_and_host_requirements_solve_unchanged(standin, package):
    v = next(v for v in chosen_variants() if v.package == package)
    requirements = render([v])[v]["recipe"]["requirements"]
    build = names(solve(standin[0], requirements["build"]))
    assert {"gcc_linux-64", "gxx_linux-64", "cuda-nvcc_linux-64", "sysroot_linux-64", "ninja"} <= set(build)
    host = names(solve(standin[0], requirements["host"]))
    assert str(host["pytorch"].version) == "2.11.0" and str(host["pytorch"].build).startswith("cuda130")
    assert str(host["python"].version).startswith("3.11.") and str(host["cuda-version"].version) == "13.0"


def test_cuda_pytorch_needs_a_cuda_driver_or_conda_override_cuda(standin):
    with pytest.raises(Exception, match="__cuda"):
        solve(standin[0], ["pytorch * cuda*"], cuda=None)


def test_every_package_says_it_is_a_stand_in(standin):
    for pkg in standin[2]:
        assert pkg.recipe(standin[0])["about"]["summary"].startswith("STAND-IN, never published")


def test_python_is_a_venv_style_interpreter_that_sees_the_pypi_tree(standin, tmp_path):
    prefix = install(standin[0], ["python", "pytorch"], tmp_path / "prefix")
    code = "import sys, torch, sympy; print(sys.prefix, torch.STANDIN)"
    out = subprocess.run([str(prefix / "bin/python"), "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == [str(prefix), "True"]
    site = prefix / "lib/python3.11/site-packages"
    assert (site / "torch").resolve() == standin[1] / "torch" and (site / "triton").resolve() == standin[1] / "triton"
    owners = {pkg.name for pkg in standin[2] for link in pkg.links if link.endswith(("/torch", "/triton", "/pip"))}
    assert owners == {"pytorch", "triton", "pip"}  # pytorch depends on triton, as conda-forge's does


def test_compiler_activation_points_conda_forge_names_at_this_machines_tools(standin, tmp_path):
    prefix = install(standin[0], ["gxx_linux-64", "cuda-nvcc_linux-64"], tmp_path / "build")
    script = ('for f in "$BUILD_PREFIX"/etc/conda/activate.d/*.sh; do source "$f" || exit 1; done; '
              'echo "$CXX|$NVCC_PREPEND_FLAGS|$NVCC_APPEND_FLAGS|$CPPFLAGS"; "$CXX" --version; nvcc --version')
    env = {"CONDA_BUILD": "1", "PREFIX": "/host", "BUILD_PREFIX": str(prefix), "PATH": f"{prefix}/bin:/usr/bin:/bin"}
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, check=True).stdout
    cxx, prepend, append, cppflags = out.splitlines()[0].split("|")
    assert cxx == f"{prefix}/bin/x86_64-conda-linux-gnu-c++" and prepend.strip() == f"-ccbin={cxx}"
    assert "-I/host/targets/x86_64-linux/include" in append and "-I/host/targets/x86_64-linux/include" in cppflags
    assert "release 13.0, V13.0.88" in out


def test_a_file_claimed_by_two_stand_ins_is_refused(tmp_path, variant):
    tree = pypi_tree(tmp_path / "pypi")
    record = next(tree.glob("triton-*.dist-info")) / "RECORD"
    record.write_text(record.read_text() + "torch/__init__.py,,\n")
    machine = standin_channel.Machine.detect(cuda_home(tmp_path / "cuda"))
    with pytest.raises(standin_channel.StandInError, match="belongs to both"):
        standin_channel.standins(variant, machine, tree)


def test_a_cpu_torch_or_another_python_or_cuda_is_refused(tmp_path, variant):
    machine = standin_channel.Machine.detect(cuda_home(tmp_path / "cuda"))
    with pytest.raises(standin_channel.StandInError, match="is a CPU build"):
        standin_channel.standins(variant, machine, pypi_tree(tmp_path / "pypi", torch_cuda=None))
    with pytest.raises(standin_channel.StandInError, match="needs Python 3.9"):
        machine.check(dataclasses.replace(variant, python="3.9"))
    with pytest.raises(standin_channel.StandInError, match="needs CUDA 12.9"):
        machine.check(dataclasses.replace(variant, cuda="12.9"))
