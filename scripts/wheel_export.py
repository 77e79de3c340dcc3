"""`python -m scripts.wheel_export PKG.conda… --out DIR`: turn conda packages into PEP 427 wheels.

The wheel holds the package's site-packages files and a fresh dist-info: METADATA whose
Requires-Dist pins torch to the minor the package was built against, WHEEL with the build tag
(280.129 = torch 2.8 + CUDA 12.9), the package's license files (info/licenses/ -> licenses/,
PEP 639) and RECORD (written by `wheel.wheelfile.WheelFile`). The same package always gives the same
bytes: entries in a fixed order, each with the time source_date_epoch() gives ($SOURCE_DATE_EPOCH when
set) and mode 0644 (0755 when executable); the wheel file itself is 0644. A package that cannot be exported
gets one error line naming it; the others are still exported, and the exit status is then 2.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import stat
import subprocess
import sys
import tempfile
import time
from email.message import Message
from pathlib import Path, PurePosixPath
from zipfile import ZipInfo

from rattler import MatchSpec, PathsJson
from rattler.package_streaming import extract
from wheel.wheelfile import WheelFile

from scripts.outputs import finished, source_date_epoch
from scripts.tools import executable
from scripts.variants import PACKAGES, VARIANTS_DIR, load, no_wheel_reason, pypi_facts, read
from scripts.wheel_names import Flavour, from_build_string

# Never folded into a manylinux check: torch's wheels and the CUDA runtime provide them.
AUDITWHEEL_EXCLUDE = frozenset({"libtorch*.so*", "libc10*.so*", "libcudart.so*"})
_SITE = {"linux-64": "lib/python{py}/site-packages/", "linux-aarch64": "lib/python{py}/site-packages/",
         "win-64": "Lib/site-packages/"}
_PLATFORM_TAG = {"linux-64": "linux_x86_64", "linux-aarch64": "linux_aarch64", "win-64": "win_amd64"}


class ExportError(RuntimeError):
    """The package can't be a relocatable wheel (prefix placeholders, files outside site-packages…)."""


def requirements(depends: list[str], flavour: Flavour, extra: list[str]) -> list[str]:
    """Requires-Dist lines for conda `depends`; torch is pinned to the build's minor (a stable-ABI build: that
    minor and up)."""
    mapping = pypi_facts()
    out = [flavour.torch_requirement]
    for dep in depends:
        spec = MatchSpec(dep)
        name = spec.name.normalized
        if name == "pytorch" or any(fnmatch.fnmatch(name, pat) for pat in mapping["drop"]):
            continue
        if name not in mapping["rename"]:
            raise ExportError(f"no PyPI name for conda dependency {dep!r}; add it to variants/pypi.yaml")
        out.append(mapping["rename"][name] + _pep440(spec))
    return out + [r for r in extra if r not in out]


def _pep440(spec: MatchSpec) -> str:
    version = str(spec.version) if spec.version else "*"
    if version == "*":
        return ""
    if "|" in version:
        raise ExportError(f"can't express conda spec {spec} as one PEP 440 specifier")
    if version[0] in "=<>!~":
        return version
    # A bare conda version is fuzzy: "3.2" and "3.2.*" both mean any 3.2.x.
    return f"=={version.removesuffix('.*')}.*"


def _wheel_requires(package: str, platform: str, flavour: Flavour) -> list[str]:
    """Wheel-only dependencies the package's variant file names (e.g. triton-windows=={triton}.*), with {triton}
    the Triton minor the wheel's torch pairs with."""
    if package not in PACKAGES:
        return []
    wanted = load(package).wheel_requires.get(platform, [])
    triton = pypi_facts().get("triton_for_torch", {}).get(flavour.torch)
    if triton is None and any("{triton}" in r for r in wanted):
        raise ExportError(f"variants/pypi.yaml: triton_for_torch has no entry for torch {flavour.torch}")
    return [r.format(triton=triton) for r in wanted]


def metadata(index: dict, about: dict, flavour: Flavour, version: str, requires: list[str],
             licenses: list[str] = ()) -> Message:
    msg = Message()
    msg["Metadata-Version"] = "2.4"  # License-Expression and License-File (PEP 639)
    msg["Name"] = index["name"]
    msg["Version"] = version
    msg["Summary"] = about.get("summary", "")
    if about.get("home"):
        msg["Home-page"] = about["home"]
    if about.get("license"):
        msg["License-Expression"] = about["license"]
    for name in licenses:
        msg["License-File"] = name
    major, minor = flavour.python.split(".")
    msg["Requires-Python"] = f">={major}.{minor},<{major}.{int(minor) + 1}"
    for req in requires:
        msg["Requires-Dist"] = req
    return msg


def wheel_info(build_tag: str, tag: str) -> Message:
    msg = Message()
    msg["Wheel-Version"] = "1.0"
    msg["Generator"] = "scripts.wheel_export"
    msg["Root-Is-Purelib"] = "false"
    msg["Tag"] = tag
    msg["Build"] = build_tag
    return msg


def site_packages_files(pkg: Path, platform: str, flavour: Flavour) -> dict[str, Path]:
    """Wheel path → extracted file, refusing anything a wheel can't place or relocate."""
    paths = PathsJson.from_package_directory(pkg).paths
    placeholders = [e.relative_path.as_posix() for e in paths if e.prefix_placeholder is not None]
    if placeholders:
        raise ExportError("files carry conda prefix placeholders and would break outside conda: "
                          + ", ".join(placeholders))
    site = _SITE[platform].format(py=flavour.python)
    files: dict[str, Path] = {}
    for entry in paths:
        rel = entry.relative_path.as_posix()
        if not rel.startswith(site):
            raise ExportError(f"{rel} lies outside {site}; a wheel can only carry site-packages files")
        inner = PurePosixPath(rel[len(site):])
        # pip writes its own dist-info at install time and byte-compiles itself.
        if inner.parts[0].endswith(".dist-info") or "__pycache__" in inner.parts:
            continue
        files[str(inner)] = pkg / rel
    return files


def make_portable(files: dict[str, Path]) -> None:
    """Keep only RPATH entries inside the wheel's own tree, then add torch's wheel libs (site-packages/torch/lib)."""
    patchelf = executable("patchelf") or "patchelf"
    for inner, path in files.items():
        if path.read_bytes()[:4] != b"\x7fELF":
            continue
        depth = len(PurePosixPath(inner).parts) - 1
        old = subprocess.run([patchelf, "--print-rpath", str(path)], capture_output=True, text=True,
                             check=True).stdout.strip()
        # Absolute entries name the build prefix; $ORIGIN entries that climb out of site-packages reach
        # conda's lib/ — neither exists once pip installs the wheel.
        kept = [p for p in old.split(":") if p.startswith("$ORIGIN") and p.count("..") <= depth]
        torch_lib = "$ORIGIN/" + "../" * depth + "torch/lib"
        subprocess.run([patchelf, "--set-rpath", ":".join(kept + [torch_lib]), str(path)], check=True)


def linux_platform_tag(wheel: Path, platform: str = "linux-64") -> str:
    """manylinux_2_XX_<cpu> when auditwheel says the Linux binary qualifies, else linux_<cpu>."""
    plain = _PLATFORM_TAG[platform]
    from auditwheel.error import NonPlatformWheelError
    from auditwheel.wheel_abi import analyze_wheel_abi

    try:
        info = analyze_wheel_abi(None, None, wheel, AUDITWHEEL_EXCLUDE, disable_isa_ext_check=True,
                                 allow_graft=False)
    except NonPlatformWheelError:
        return plain
    # Without grafting, overall_policy already accounts for libraries the wheel would need from outside.
    name = info.overall_policy.name
    return name if name.startswith("manylinux_") else plain


def unpack(conda: Path, pkg: Path) -> tuple[dict, dict]:
    """Extract a .conda into pkg; returns its index.json and about.json. A corrupt archive is an ExportError."""
    try:
        extract(conda, pkg)
        index = json.loads((pkg / "info" / "index.json").read_text(encoding="utf-8"))
        about_file = pkg / "info" / "about.json"
        about = json.loads(about_file.read_text(encoding="utf-8")) if about_file.exists() else {}
    except (OSError, ValueError) as exc:  # ValueError: bad JSON or text
        raise ExportError(f"not a readable conda package: {exc}") from exc
    missing = [key for key in ("name", "version", "build", "subdir") if key not in index]
    if missing:
        raise ExportError(f"info/index.json lacks {', '.join(missing)}")
    return index, about


def license_files(pkg: Path) -> dict[str, Path]:
    """The package's license files (info/licenses/, from the recipe's about.license_file) by relative name."""
    root = pkg / "info" / "licenses"
    found = {f.relative_to(root).as_posix(): f for f in sorted(root.rglob("*")) if f.is_file()}
    if not found:
        raise ExportError("the package has no license files (info/licenses/); set about.license_file in its recipe")
    return found


def export(conda: Path, out_dir: Path, *, local_version: bool = False, manylinux: bool = True) -> Path:
    """Write the wheel for one .conda package into out_dir and return its path; ExportError names the package."""
    try:
        return _export(conda, out_dir, local_version, manylinux)
    except (ExportError, ValueError, subprocess.CalledProcessError) as exc:  # ValueError: a foreign build string
        raise ExportError(f"{conda}: {' '.join(str(exc).split())}") from exc


def _export(conda: Path, out_dir: Path, local_version: bool, manylinux: bool) -> Path:
    with tempfile.TemporaryDirectory(prefix="sage-export-") as tmp:
        pkg = Path(tmp) / "pkg"
        index, about = unpack(conda, pkg)
        platform = index["subdir"]
        if platform not in _SITE:
            raise ExportError(f"platform {platform!r} not supported; supported: {', '.join(_SITE)}")
        flavour = from_build_string(index["build"])
        refused = no_wheel_reason(platform, flavour.torch)
        if refused:
            raise ExportError(refused)
        version = f"{index['version']}+{flavour.local_label}" if local_version else index["version"]
        files = site_packages_files(pkg, platform, flavour)
        licenses = license_files(pkg)
        linux = platform.startswith("linux-")
        if linux:
            make_portable(files)
        requires = requirements(index.get("depends", []), flavour, _wheel_requires(index["name"], platform, flavour))
        plat = _PLATFORM_TAG[platform]
        if manylinux and linux:  # auditwheel inspects a draft wheel for its manylinux tag
            plat = linux_platform_tag(_write(Path(tmp), index, about, flavour, version, files, plat), platform)
        out_dir.mkdir(parents=True, exist_ok=True)
        return _write(out_dir, index, about, flavour, version, files, plat, requires, licenses)


class ReproducibleWheel(WheelFile):
    """A WheelFile whose bytes depend only on what goes in, not on when or from which files on disk."""

    def _entry(self, name: str, mode: int) -> ZipInfo:
        info = ZipInfo(name, date_time=time.gmtime(source_date_epoch())[:6])
        info.compress_type = self.compression
        info.external_attr = (mode | stat.S_IFREG) << 16
        return info

    def writestr(self, zinfo_or_arcname, data, compress_type=None) -> None:
        if isinstance(zinfo_or_arcname, str):  # also RECORD, which WheelFile.close writes
            zinfo_or_arcname = self._entry(zinfo_or_arcname, 0o644)
        super().writestr(zinfo_or_arcname, data, compress_type)

    def write(self, filename, arcname=None, compress_type=None) -> None:
        mode = 0o755 if os.stat(filename).st_mode & 0o111 else 0o644
        self.writestr(self._entry(arcname or str(filename), mode), Path(filename).read_bytes(), compress_type)


def _write(out_dir: Path, index: dict, about: dict, flavour: Flavour, version: str, files: dict[str, Path],
           plat: str, requires: list[str] = (), licenses: dict[str, Path] | None = None) -> Path:
    name = flavour.wheel_name(index["name"], version, plat)
    licenses = licenses or {}
    # Written in a hidden scratch folder beside the target and renamed, so a failed export leaves no half-written
    # wheel where a later step looks (scripts.ci skips hidden folders).
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".partial-") as scratch:
        partial = Path(scratch) / name
        with ReproducibleWheel(partial, "w") as whl:
            for inner in sorted(files):
                whl.write(files[inner], inner)
            for rel, path in licenses.items():
                whl.write(path, f"{whl.dist_info_path}/licenses/{rel}")
            whl.writestr(f"{whl.dist_info_path}/METADATA",
                         metadata(index, about, flavour, version, list(requires), list(licenses)).as_string())
            whl.writestr(f"{whl.dist_info_path}/WHEEL",
                         wheel_info(flavour.build_tag, f"{flavour.wheel_tags}-{plat}").as_string())
        partial.chmod(0o644)
        return partial.replace(out_dir / name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.wheel_export", description=__doc__)
    parser.add_argument("packages", nargs="+", type=Path, help=".conda files or channel directories")
    parser.add_argument("--out", type=Path, default=Path("dist/wheels"))
    parser.add_argument("--local-version", action="store_true",
                        help="version wheels 1.0.0+cu129torch2.8 (build tag kept) so pip can choose by version")
    parser.add_argument("--no-manylinux", action="store_true", help="keep linux_<cpu> even when auditwheel qualifies")
    args = parser.parse_args(argv)
    condas = [p for arg in args.packages for p in (finished(arg, "*.conda") if arg.is_dir() else [arg])]
    failed = 0
    for conda in condas:
        try:
            print(export(conda, args.out, local_version=args.local_version, manylinux=not args.no_manylinux))
        except ExportError as exc:
            print(f"error: {exc}", file=sys.stderr)
            failed += 1
    return 2 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
