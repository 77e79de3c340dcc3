"""Names shared by the exporter, the checker and the index pages: build tags and conda build strings."""
from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.utils import canonicalize_name, parse_wheel_filename

import build_rules

# The optional sm<archs> records a TORCH_CUDA_ARCH_LIST other than the variant's (see arch_tag).
_ARCHS = r"sm(?P<archs>\d[0-9afptx.]*)"
_BUILD_STRING = re.compile(
    rf"^cu(?P<cuda>\d{{3}})torch(?P<torch>\d{{2,3}})(?P<up>up)?py(?P<py>\d{{2,3}})(?:{_ARCHS})?h[0-9a-f]+_\d+$")
_BUILD_TAG = re.compile(rf"^(?P<torch>\d{{2,3}})0(?P<up>up)?\.(?P<cuda>\d{{3}})(?:\.{_ARCHS})?$")


# The oldest CPython whose limited API the stable-ABI modules are built for.
STABLE_PYTHON_TAG = build_rules.support.LIMITED_API


@dataclass(frozen=True)
class Flavour:
    """CUDA, torch and Python a package was built for (torch and CUDA as major.minor), and its arch tag: empty for
    the variant's own arch list, else the other list it was built for (arch_tag), so the names differ too.
    A stable-ABI flavour loads under `torch` and every newer torch: its names say "up" after the torch
    (docs/building.md, Stable-ABI builds) and its wheel is cp310-abi3 whatever Python built it."""

    cuda: str
    torch: str
    python: str
    archs: str = ""
    stable: bool = False

    @property
    def _up(self) -> str:
        return "up" if self.stable else ""

    @property
    def _arch_suffix(self) -> str:
        return f".sm{self.archs}" if self.archs else ""

    @property
    def build_tag(self) -> str:
        return f"{self.torch.replace('.', '')}0{self._up}.{self.cuda.replace('.', '')}{self._arch_suffix}"

    @property
    def torch_requirement(self) -> str:
        """The wheel's Requires-Dist on torch: its minor (torch==2.8.*), or that minor and up for a stable-ABI build."""
        return f"torch>={self.torch}" if self.stable else f"torch=={self.torch}.*"

    @property
    def python_tag(self) -> str:
        return f"cp{self.python.replace('.', '')}"

    @property
    def build_string_prefix(self) -> str:
        """The conda build string up to its hash, e.g. cu129torch28py312 or cu129torch28py312sm120 (from_build_string
        reads it back)."""
        return (f"cu{self.cuda.replace('.', '')}torch{self.torch.replace('.', '')}{self._up}py{self.python.replace('.', '')}"
                + (f"sm{self.archs}" if self.archs else ""))

    @property
    def wheel_tags(self) -> str:
        """The wheel's Python and ABI tags: cp312-cp312, or cp310-abi3 for a stable-ABI build."""
        return f"{STABLE_PYTHON_TAG}-abi3" if self.stable else f"{self.python_tag}-{self.python_tag}"

    def wheel_name(self, name: str, version: str, platform: str) -> str:
        """PEP 427 filename of this flavour's wheel, e.g. sageattn3-1.0.0-280.129-cp312-cp312-linux_x86_64.whl or
        sageattn3-1.0.0-2100up.130-cp310-abi3-linux_x86_64.whl."""
        dist = canonicalize_name(name).replace("-", "_")
        return f"{dist}-{version}-{self.build_tag}-{self.wheel_tags}-{platform}.whl"

    @property
    def index_page(self) -> str:
        return page_name(self.cuda, self.torch)

    @property
    def local_label(self) -> str:
        return f"cu{self.cuda.replace('.', '')}torch{self.torch}{self._arch_suffix}"


def arch_tag(arch_list: str | None, variant_list: str) -> str:
    """What a build string records of TORCH_CUDA_ARCH_LIST: "" when the build uses the variant's list (unset or
    equal), else the list in build-string characters, "9.0a;12.0+PTX" -> "90a.120ptx". The recipes get it through
    the variant config (Variant.variant_config)."""
    chosen = (arch_list or "").strip() or variant_list
    if chosen == variant_list:
        return ""
    chosen = chosen.replace(".", "")
    for separator in ";, ":
        chosen = chosen.replace(separator, ".")
    return chosen.replace("+PTX", "ptx")


def page_name(cuda: str, torch: str) -> str:
    """The pip index (scripts.index_pages) of a CUDA × torch pair, e.g. cu12-torch2.8: one per CUDA major."""
    return f"cu{cuda.split('.')[0]}-torch{torch}"


def _torch(digits: str) -> str:
    # torch majors are one digit: "28" is 2.8, "210" is 2.10.
    return f"{digits[0]}.{digits[1:]}"


def _cuda(digits: str) -> str:
    # CUDA majors are two digits from 10 on: "129" is 12.9, "130" is 13.0.
    return f"{digits[:2]}.{digits[2:]}"


def from_build_string(build: str) -> Flavour:
    """Decode a conda build string such as cu129torch28py312h1a2b3c4_0."""
    m = _BUILD_STRING.match(build)
    if not m:
        raise ValueError(f"build string {build!r} does not look like "
                         "cu<CUDA>torch<torch>py<Python>[sm<archs>]h<hash>_<n>")
    return Flavour(_cuda(m["cuda"]), _torch(m["torch"]), f"{m['py'][0]}.{m['py'][1:]}", m["archs"] or "",
                   stable=bool(m["up"]))


def decode_build_tag(tag: str) -> tuple[str, str]:
    """(torch, CUDA) from a wheel build tag such as 280.129 (or 280.129.sm120, built for other archs; 2100up.130 is
    the stable-ABI build for torch 2.10 and up, whose torch here is its floor)."""
    m = _BUILD_TAG.match(tag)
    if not m:
        raise ValueError(f"build tag {tag!r} is not <torch major><torch minor>0.<CUDA major><CUDA minor>, e.g. 280.129 "
                         "(2100up.130: torch 2.10 and up)")
    return _torch(m["torch"]), _cuda(m["cuda"])


def wheel_torch_requirement(filename: str) -> str | None:
    """The Requires-Dist on torch that a wheel's build tag calls for; None when it has no build tag."""
    _, _, build, _ = parse_wheel_filename(filename)
    if not build:
        return None
    tag = f"{build[0]}{build[1]}"
    torch, cuda = decode_build_tag(tag)
    return Flavour(cuda, torch, "", stable=bool(_BUILD_TAG.match(tag)["up"])).torch_requirement


def wheel_flavour(filename: str) -> tuple[str, str] | None:
    """(torch, CUDA) of a wheel file, from its build tag; None when it has none."""
    _, _, build, _ = parse_wheel_filename(filename)
    if not build:
        return None
    return decode_build_tag(f"{build[0]}{build[1]}")


_MANYLINUX = re.compile(r"^manylinux(?:_\d+_\d+|1|2010|2014)_(?P<cpu>x86_64|aarch64)$")


def is_wheel_named(expected: str, found: str) -> bool:
    """Whether `found` is the wheel `expected` names; a manylinux tag stands for linux_<cpu> (auditwheel's rename)."""
    try:
        want, got = parse_wheel_filename(expected), parse_wheel_filename(found)
    except ValueError:
        return False
    if want[:3] != got[:3]:
        return False
    (tag,) = want[3]
    def same_platform(platform: str) -> bool:
        manylinux = _MANYLINUX.match(platform)
        return platform == tag.platform or (manylinux is not None and tag.platform == f"linux_{manylinux['cpu']}")

    return all((t.interpreter, t.abi) == (tag.interpreter, tag.abi) and same_platform(t.platform) for t in got[3])
