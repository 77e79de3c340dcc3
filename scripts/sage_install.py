"""Install sageattention or sageattn3 for this Python's torch, CUDA and Python, without pip touching torch.

    python sage_install.py sageattn3 [--dry-run] [--site URL] [-- PIP_ARGS...]

Reads the installed torch (version, CUDA line) and this Python (version, platform), finds the pip index
built for that torch in SITE/indexes.json (cu<CUDA major>-torch<major.minor>) and, on its page, the
newest version with a wheel for this Python, then runs
    python -m pip install <package>==<version> torch==<installed torch> --extra-index-url SITE/<index>/simple
Both pins make pip take our wheel or stop: it can neither change torch nor fall back to another
package of the same name on PyPI. Where nothing fits, it says why. Stands alone (standard library
only); the release publishes it beside the indexes, with SITE set to their address (docs/installing.md).

Each index also holds, per version, a source distribution whose build backend is this file with GUARD
set (scripts/index_pages.py): pip only tries to build it when none of that version's wheels fits this
Python, and building it stops with the reason (refusal), so pip never settles for a same-named package
elsewhere.
"""
import argparse
import html.parser
import json
import platform
import re
import subprocess
import sys
import sysconfig
import urllib.error
import urllib.parse
import urllib.request

SITE = ""  # set in the published copy (scripts/index_pages.py); here, pass --site
GUARD = None  # in a guard source distribution's copy: {"package", "index", "wheels"} (scripts/index_pages.py)
TIMEOUT_S = 30


def here() -> tuple:
    """(interpreter, platform) of this Python in the terms of wheel_target, e.g. ("CPython 3.12", "linux-x86_64")."""
    return f"{platform.python_implementation()} {sys.version_info[0]}.{sys.version_info[1]}", sysconfig.get_platform()


def wheel_target(filename: str) -> tuple:
    """(interpreter, platform) a wheel is for: sageattn3-1.0.0-280.129-cp312-cp312-manylinux_2_28_x86_64.whl ->
    ("CPython 3.12", "linux-x86_64"), the form here() gives."""
    python, plat = filename[:-len(".whl")].split("-")[-3::2]
    plat = re.sub(r"^(many)?linux(_\d+_\d+|1|2010|2014)?_", "linux-", plat).replace("win_", "win-")
    return f"CPython {python[2]}.{python[3:]}" if python.startswith("cp") else python, plat


def describe(wheels: list) -> str:
    """The interpreters and platforms `wheels` are for: "CPython 3.10, 3.11 on linux-x86_64; CPython 3.12 on win-amd64"."""
    by_platform = {}
    for wheel in wheels:
        python, plat = wheel_target(wheel)
        by_platform.setdefault(plat, set()).add(python)
    return "; ".join(f"{', '.join(sorted(pythons, key=lambda p: [int(n) for n in p.split()[-1].split('.')]))} on {plat}"
                     .replace(", CPython ", ", ") for plat, pythons in sorted(by_platform.items()))


def refusal(package: str, index: str, wheels: list) -> str:
    """Why pip gets none of `wheels` (one version's files on `index`) in this Python."""
    python, plat = here()
    return f"error: the index {index} has no {package} wheel for {python} on {plat}, only for {describe(wheels)}"


def _refuse(*args, **kwargs):
    raise SystemExit(refusal(GUARD["package"], GUARD["index"], GUARD["wheels"]))


# The PEP 517 hooks pip calls to build the guard source distribution: each stops with the reason.
get_requires_for_build_wheel = prepare_metadata_for_build_wheel = build_wheel = _refuse
get_requires_for_build_sdist = build_sdist = _refuse


class _Links(html.parser.HTMLParser):
    """The file names a simple index page links to."""

    def __init__(self):
        super().__init__()
        self.files = []

    def handle_starttag(self, tag, attrs):
        href = dict(attrs).get("href") if tag == "a" else None
        if href:
            self.files.append(urllib.parse.unquote(href.split("#")[0].rsplit("/", 1)[-1]))


def fetch(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            return response.read().decode()
    except (urllib.error.URLError, OSError) as exc:
        raise SystemExit(f"error: can't read {url}: {exc}")


def torch_flavour() -> tuple:
    """(installed torch version, its major.minor, CUDA major); SystemExit with the reason where there is none."""
    try:
        import torch
    except ImportError:
        raise SystemExit("error: torch is not installed in this Python; install a CUDA build of torch first")
    if not torch.version.cuda:
        raise SystemExit(f"error: torch {torch.__version__} is a CPU build; our wheels need a CUDA build of torch")
    if sys.platform.startswith("linux") and not torch.compiled_with_cxx11_abi():
        raise SystemExit(f"error: torch {torch.__version__} is built with the pre-C++11 C++ ABI (PyPI's older Linux "
                         "builds), which our Linux wheels can't load with; upgrade torch, or install the conda "
                         "package (docs/installing.md)")
    return torch.__version__, ".".join(torch.__version__.split("+")[0].split(".")[:2]), torch.version.cuda.split(".")[0]


def choose(indexes: dict, package: str, torch: str, cuda: str) -> str:
    """The index of `package` for torch × CUDA major; SystemExit naming what we build for."""
    name = f"cu{cuda}-torch{torch}"
    if package in indexes.get(name, {}):
        return name
    built = sorted(n for n, packages in indexes.items() if package in packages)
    raise SystemExit(f"error: no {package} wheels for torch {torch} with CUDA {cuda}.x; {package} is built for "
                     + ", ".join(f"torch {n.split('-torch')[1]} with CUDA {n.split('-')[0][2:]}.x" for n in built))


def newest_fitting(versions: list, wheels: list, package: str, index: str) -> str:
    """The newest of `versions` (oldest first) with a wheel among `wheels` for this Python; SystemExit saying why not."""
    dist = re.sub(r"[-_.]+", "_", package)
    for version in reversed(versions):
        if any(w.startswith(f"{dist}-{version}-") and wheel_target(w) == here() for w in wheels):
            return version
    newest = [w for w in wheels if w.startswith(f"{dist}-{versions[-1]}-")]
    raise SystemExit(refusal(package, index, newest))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="sage_install.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("package", choices=("sageattention", "sageattn3"))
    parser.add_argument("--site", default=SITE, help="where the indexes are (default: %(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="print the pip command, run nothing")
    parser.add_argument("pip_args", nargs="*", help="after --: passed on to pip")
    args = parser.parse_args(argv)
    if not args.site:
        parser.error("--site is required (the published copy of this script knows its site)")
    site = args.site.rstrip("/")
    torch_version, torch, cuda = torch_flavour()
    indexes = json.loads(fetch(f"{site}/indexes.json"))
    name = choose(indexes, args.package, torch, cuda)
    links = _Links()
    links.feed(fetch(f"{site}/{name}/simple/{args.package}/"))
    wheels = [f for f in links.files if f.endswith(".whl")]
    version = newest_fitting(indexes[name][args.package], wheels, args.package, name)
    cmd = [sys.executable, "-m", "pip", "install", f"{args.package}=={version}", f"torch=={torch_version}",
           "--extra-index-url", f"{site}/{name}/simple", *args.pip_args]
    print(" ".join(cmd), flush=True)
    return 0 if args.dry_run else subprocess.run(cmd, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
