"""Install sageattention or sageattn3 for the torch of this Python without pip touching torch.

    python sage_install.py sageattn3 [--dry-run] [--site URL] [-- PIP_ARGS...]

Reads torch's version and CUDA line, picks the pip index built for them from SITE/indexes.json
(cu<CUDA major>-torch<major.minor>) and runs
    python -m pip install <package>==<newest version there> --extra-index-url SITE/<index>/simple
so pip takes the wheel built for the installed torch. Stands alone (standard library only); the
release publishes it beside the indexes, with SITE set to their address (docs/installing.md).
"""
import argparse
import json
import subprocess
import sys
import urllib.request

SITE = ""  # set in the published copy (scripts/index_pages.py); here, pass --site


def torch_flavour() -> tuple[str, str]:
    """(torch major.minor, CUDA major) of the installed torch; SystemExit with the reason where there is none."""
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
    return ".".join(torch.__version__.split("+")[0].split(".")[:2]), torch.version.cuda.split(".")[0]


def choose(indexes: dict, package: str, torch: str, cuda: str) -> tuple[str, str]:
    """(index name, newest version) of `package` for torch × CUDA major; SystemExit naming what we build for."""
    name = f"cu{cuda}-torch{torch}"
    if package in indexes.get(name, {}):
        return name, indexes[name][package][-1]
    built = sorted(n for n, packages in indexes.items() if package in packages)
    raise SystemExit(f"error: no {package} wheels for torch {torch} with CUDA {cuda}.x; {package} is built for "
                     + ", ".join(f"torch {n.split('-torch')[1]} with CUDA {n.split('-')[0][2:]}.x" for n in built))


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
    with urllib.request.urlopen(f"{site}/indexes.json") as response:
        indexes = json.load(response)
    name, version = choose(indexes, args.package, *torch_flavour())
    cmd = [sys.executable, "-m", "pip", "install", f"{args.package}=={version}",
           "--extra-index-url", f"{site}/{name}/simple", *args.pip_args]
    print(" ".join(cmd), flush=True)
    return 0 if args.dry_run else subprocess.run(cmd, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
