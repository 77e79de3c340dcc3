"""What both packages' stable-ABI tests share (sageattn3's test_sage3_cuda_compile.py, sageattention's
tests/sageattention/test_stable_abi.py): the CUDA toolkit, a wheel built with SAGE_BUILD_CUDA=1 against the
installed torch, what its extension takes from libtorch and CPython, and PyPI's CUDA torch releases to load it
under, each pip-installed once into .cache/stable-abi-torch/.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

# The repository's .cache/ (this file is sageattention3_blackwell/tests/stable_abi_checks.py).
TORCH_TREES = Path(__file__).resolve().parents[2] / ".cache" / "stable-abi-torch"
# The oldest and the newest CUDA 13 torch this machine's pip installs from PyPI (PyPI's torch 2.10 is a CUDA 12
# build; /etc/xdg/pip caps torch at 2.14.1). Each is pip-installed once into its own folder of TORCH_TREES (the
# newest with every CUDA library its wheel requires, ~5 GB; older ones alone, finding those libraries, of the same
# CUDA major, in the newest's folder) and reused while the folder is complete.
CUDA13_TORCH = ("2.11.0", "2.14.1")


def cuda_home() -> Path | None:
    nvcc = shutil.which("nvcc")
    for home in (os.environ.get("CUDA_HOME"), nvcc and Path(nvcc).parents[1], "/usr/local/cuda"):
        if home and (Path(home) / "include" / "cuda_runtime.h").is_file() and (Path(home) / "bin" / "nvcc").exists():
            return Path(home)
    return None


def build_wheel(source: Path, out: Path, arch_list: str, **env) -> Path:
    """The wheel of `source` built with SAGE_BUILD_CUDA=1 for `arch_list` against the installed torch (or the one
    `env`'s PYTHONPATH gives), in its default flavour (stable ABI for torch >= 2.10) unless `env` says
    SAGE_STABLE_ABI; skips without the toolkit or with an older torch."""
    home = cuda_home()
    if home is None:
        pytest.skip("needs the CUDA toolkit (nvcc and its headers; set CUDA_HOME)")
    if tuple(int(n) for n in torch.__version__.split(".")[:2]) < (2, 10):
        pytest.skip(f"the stable-ABI build needs torch >= 2.10 to build against, found {torch.__version__}")
    inherited = {k: v for k, v in os.environ.items() if k != "SAGE_STABLE_ABI"}
    env = {**inherited, "SAGE_BUILD_CUDA": "1", "CUDA_HOME": str(home), "TORCH_CUDA_ARCH_LIST": arch_list,
           "MAX_JOBS": "2", **env}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w", str(out),
                    str(source)], check=True, env=env, capture_output=True, text=True)
    (wheel,) = out.glob("*.whl")
    return wheel


def unpack(wheel: Path, folder: Path) -> Path:
    with zipfile.ZipFile(wheel) as whl:
        whl.extractall(folder)
    return folder


def undefined_symbols(library: Path, demangle: bool) -> set:
    flags = ["-D", "--undefined-only"] + (["-C"] if demangle else [])
    lines = subprocess.run(["nm", *flags, str(library)], capture_output=True, text=True, check=True).stdout
    return {line.split(None, 1)[1].split("@")[0] for line in lines.splitlines() if line.strip()}


def check_stable_symbols(library: Path, python_used: set) -> None:
    """No C++ symbol of libtorch (whose ABI changes between releases); from CPython only `python_used` (limited
    API); from libtorch only C functions that the installed libtorch_cpu exports (older torch: the load tests)."""
    cpp = [s for s in undefined_symbols(library, demangle=True) if re.match(r"(c10|at|torch|caffe2)::", s)]
    assert not cpp, f"C++ symbols of libtorch, whose ABI changes between releases: {sorted(cpp)[:10]}"
    names = undefined_symbols(library, demangle=False)
    python = {s for s in names if re.match(r"_?Py", s)}
    assert python == python_used, f"Python symbols outside the limited API: {sorted(python - python_used)}"
    shim = {s for s in names if s.startswith(("aoti_torch_", "torch_"))}
    assert "torch_library_impl" in shim
    exported = subprocess.run(["nm", "-D", "--defined-only", str(Path(torch.__file__).parent / "lib/libtorch_cpu.so")],
                              capture_output=True, text=True, check=True).stdout.split()
    assert shim <= set(exported), sorted(shim - set(exported))


def toolkit_env() -> dict:
    """The environment that loads the extension under the installed torch: it needs libcudart, which a CUDA torch
    loads first; under a CPU torch the toolkit's stands in."""
    lib = str(cuda_home() / "lib64")
    return {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [lib, os.environ.get("LD_LIBRARY_PATH")]))}


def pypi_torch_env(version: str) -> dict:
    """The environment whose `import torch` is PyPI's CUDA 13 torch `version` (with the newest's CUDA libraries)."""
    trees = [torch_tree(version), torch_tree(CUDA13_TORCH[-1])]
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "PYTHONPATH")}
    return {**env, "PYTHONPATH": os.pathsep.join(map(str, trees))}


def torch_alone(version: str, folder: Path) -> Path:
    """A folder for PYTHONPATH that holds PyPI's torch `version` (and its CUDA libraries) but not the rest of its
    tree, whose older setuptools would shadow the build's."""
    tree = torch_tree(version)
    for name in ("torch", "torchgen", "functorch", "nvidia"):
        if (tree / name).exists():
            (folder / name).symlink_to(tree / name)
    return folder


def torch_tree(version: str) -> Path:
    """PyPI's torch `version`, pip-installed once into its own folder (skips when pip cannot install it)."""
    import fcntl  # test workers running at once (pytest -n) install each folder once

    tree = TORCH_TREES / f"torch-{version}"
    TORCH_TREES.mkdir(parents=True, exist_ok=True)
    with open(TORCH_TREES / f"torch-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (tree / ".complete").is_file():
            return tree
        shutil.rmtree(tree, ignore_errors=True)
        deps = [] if version == CUDA13_TORCH[-1] else ["--no-deps"]
        # With bytecode compiled at install: an import that compiles torch's sources each time takes 20 s more.
        # Short timeouts: a machine without the network (the GPU machine) skips these tests at once.
        run = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                              "--timeout", "20", "--retries", "1", *deps, "--target", str(tree), f"torch=={version}"],
                             capture_output=True, text=True)
        if run.returncode != 0:
            shutil.rmtree(tree, ignore_errors=True)
            pytest.skip(f"pip could not install torch {version}: {run.stderr.strip().splitlines()[-1:]}")
        (tree / ".complete").write_text(version)
    return tree


def compile_against_aten(source: Path, *include_dirs: Path) -> None:
    """A binding as the version-specific build compiles it (torch_binding.h's ATen side), against the headers of
    PyPI's newest CUDA torch (C++20, as torch's BuildExtension asks for them): CPU builds of torch lack c10/cuda's
    generated header. Syntax and templates only, no code: seconds."""
    compile_binding(source, CUDA13_TORCH[-1], [("SAGE_STABLE_ABI", "0")], "-std=c++20", *include_dirs)


def compile_stable(source: Path, version: str, *include_dirs: Path) -> None:
    """A binding as the stable-ABI build compiles it, against the headers of PyPI's torch `version`: each torch's
    headers move (a macro renamed, an overload added), and the build must work against any torch >= 2.10."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    try:
        import build_support
    finally:
        sys.path.pop(0)
    compile_binding(source, version, build_support.stable_abi_macros() + [("Py_LIMITED_API", "0x030A0000")],
                    "-std=c++17", *include_dirs)


def compile_binding(source: Path, version: str, macros: list, std: str, *include_dirs: Path) -> None:
    home = cuda_home()
    if home is None or shutil.which("g++") is None:
        pytest.skip("needs g++ and the CUDA toolkit's headers")
    include = torch_tree(version) / "torch" / "include"
    python = subprocess.run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"],
                            capture_output=True, text=True, check=True).stdout.strip()
    run = subprocess.run(["g++", std, "-fsyntax-only", "-w", *(f"-D{k}={v}" for k, v in macros), f"-I{include}",
                          f"-I{include}/torch/csrc/api/include", f"-I{home}/include", f"-I{python}",
                          f"-I{Path(__file__).resolve().parents[1] / 'csrc'}", *(f"-I{d}" for d in include_dirs),
                          str(source)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
