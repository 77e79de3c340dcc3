"""The build matrix, read from variants/: rows × platforms → conda variants, and profiles that pick them.

Everything that builds, tests or documents a variant goes through `load()` so that the data is
validated once, with errors that name the file, the row and what is supported.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path

import jsonschema
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from scripts.wheel_names import Flavour, arch_tag

ROOT = Path(__file__).resolve().parent.parent
VARIANTS_DIR = ROOT / "variants"
PLATFORMS = ("linux-64", "linux-aarch64", "win-64")
PACKAGES = ("sageattention", "sageattn3")
_PLATFORM_WORD = {"linux-64": "linux", "linux-aarch64": "linux-aarch64", "win-64": "windows"}


class VariantError(ValueError):
    """Bad variant data, unknown package or profile: raised before anything is built."""


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _digits(version: str) -> str:
    return version.replace(".", "")


@dataclass(frozen=True)
class Variant:
    """One conda build (and the wheel exported from it): a package on a platform for torch × CUDA × Python."""

    package: str
    version: str
    short: str
    import_name: str
    recipe: str
    platform: str
    row_set: str  # "seed" or "current"
    python: str
    requested_torch: str  # the row as written (seed documents' versions)
    requested_cuda: str
    torch_version: str  # what the conda build uses (differs when the row names a substitute)
    cuda: str
    substitute: str | None
    cuda_arch_list: str
    toolchain: dict = field(compare=False, hash=False)
    wheel_platform: str = ""
    arch_tag: str = ""  # set by with_arch_list: built for other archs than cuda_arch_list
    arch_list: str = ""  # set by with_arch_list: the caller's TORCH_CUDA_ARCH_LIST
    no_wheel: str | None = None  # why this build is a conda package only (no_wheel_reason)
    stable: bool = False  # a stable-ABI build: loads under torch_version and every newer torch

    def with_arch_list(self, arch_list: str | None) -> Variant:
        """This variant built with TORCH_CUDA_ARCH_LIST=arch_list (None or empty: its own list), and named so."""
        return replace(self, arch_tag=arch_tag(arch_list, self.cuda_arch_list), arch_list=(arch_list or "").strip())

    @property
    def torch(self) -> str:
        return _minor(self.torch_version)

    @property
    def name(self) -> str:
        """Target name in the seed documents' style, e.g. linux-sage3-pytorch28-cu129-python312."""
        return (f"{_PLATFORM_WORD[self.platform]}-{self.short}-pytorch{_digits(_minor(self.requested_torch))}"
                f"{'up' if self.stable else ''}"
                f"-cu{_digits(_minor(self.requested_cuda))}-python{_digits(self.python)}")

    @property
    def flavour(self) -> Flavour:
        return Flavour(self.cuda, self.torch, self.python, self.arch_tag, self.stable)

    @property
    def build_tag(self) -> str:
        return self.flavour.build_tag

    @property
    def build_string_prefix(self) -> str:
        return self.flavour.build_string_prefix

    @property
    def wheel(self) -> str:
        return self.flavour.wheel_name(self.package, self.version, self.wheel_platform)

    @property
    def index_page(self) -> str:
        return self.flavour.index_page

    def variant_config(self) -> dict[str, str]:
        """The keys rattler-build's variant config needs for this build (all zipped, one value each)."""
        return {
            "python": self.python,
            "pytorch": self.torch,
            "cuda_compiler": self.toolchain["cuda_compiler"],
            "cuda_compiler_version": self.cuda,
            # what the build compiles for, and what its build string records of that (wheel_names.arch_tag)
            "cuda_arch_list": self.arch_list or self.cuda_arch_list,
            "arch_tag": f"sm{self.arch_tag}" if self.arch_tag else "",
            # SAGE_STABLE_ABI for the build (1: stable ABI, 0: version-specific) and what the build string says of it
            "stable_abi": "1" if self.stable else "0",
            "torch_up": "up" if self.stable else "",
            "package_version": self.version,
            **{k: v for k, v in self.toolchain.items() if k != "cuda_compiler"},
        }

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "package": self.package,
            "version": self.version,
            "platform": self.platform,
            "set": self.row_set,
            "python": self.python,
            "torch": self.torch,
            "torch_version": self.torch_version,
            "cuda": self.cuda,
            "requested": {"torch": self.requested_torch, "cuda": self.requested_cuda},
            "substitute": self.substitute,
            "stable_abi": self.stable,
            "build_tag": self.build_tag,
            "cuda_arch_list": self.cuda_arch_list,
            "recipe": self.recipe,
            "conda_build_string": f"{self.build_string_prefix}h*_0",
            "conda_spec": f"{self.package} {self.version} {self.build_string_prefix}*",
            "wheel": None if self.no_wheel else self.wheel,
            "no_wheel": self.no_wheel,
            "index_page": self.index_page,
            "variant_config": self.variant_config(),
        }


@dataclass(frozen=True)
class Unavailable:
    """A row that conda-forge can't build on a platform (kept so the docs can show it)."""

    package: str
    platform: str
    torch: str
    cuda: str
    python: tuple[str, ...]
    why: str


@dataclass
class Matrix:
    package: str
    version: str
    variants: list[Variant]
    unavailable: list[Unavailable]
    profiles: dict[str, dict]
    min_cuda: str | None = None  # the package refuses older CUDA (its archs.py's MIN_CUDA)
    wheel_requires: dict[str, list[str]] = field(default_factory=dict)  # platform -> wheel-only Requires-Dist

    def named(self, name: str, profile: str | None = None, platform: str | None = None) -> Variant:
        """The variant called `name` (in `profile` and on `platform` when given); an error lists the choices."""
        pool = self.variants if profile is None else self.select(profile, platform)
        for v in pool:
            if v.name == name and (platform is None or v.platform == platform):
                return v
        where = " ".join(filter(None, (platform, f"profile {profile!r}" if profile else None)))
        raise VariantError(f"no {self.package} variant named {name!r}{' in ' + where if where else ''}; "
                           f"`pixi run matrix --package {self.package} --profile PROFILE` lists them")

    def select(self, profile: str, platform: str | None = None) -> list[Variant]:
        if profile not in self.profiles:
            raise VariantError(f"unknown profile {profile!r} for {self.package}; "
                               f"supported: {', '.join(self.profiles)}")
        spec = self.profiles[profile]
        chosen = [v for v in self.variants
                  if (platform is None or v.platform == platform)
                  and any(_matches(v, sel) for sel in spec["select"])]
        if spec.get("newest_python"):
            newest: dict[tuple, Variant] = {}
            for v in chosen:
                key = (v.platform, v.requested_torch, v.requested_cuda, v.stable)
                if key not in newest or Version(v.python) > Version(newest[key].python):
                    newest[key] = v
            chosen = [v for v in chosen if newest[(v.platform, v.requested_torch, v.requested_cuda, v.stable)] is v]
        return chosen

    def binaries(self, profile: str, platform: str | None = None) -> tuple[int, int]:
        """(version-specific builds of a profile, its builds once its stable-ABI builds replace the version-specific
        ones they serve: same CUDA, torch from their floor on)."""
        chosen = self.select(profile, platform)
        floors = {(v.platform, v.cuda, Version(v.torch)) for v in chosen if v.stable}
        def served(v: Variant) -> bool:
            return any((v.platform, v.cuda) == (p, cuda) and Version(v.torch) >= floor for p, cuda, floor in floors)

        return sum(not v.stable for v in chosen), sum(v.stable or not served(v) for v in chosen)


def _matches(v: Variant, sel: dict) -> bool:
    wanted = {"set": v.row_set, "torch": _minor(v.requested_torch),
              "cuda": _minor(v.requested_cuda), "python": v.python, "stable_abi": v.stable}
    return all(wanted[k] == val for k, val in sel.items())


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key written twice in one mapping is an error (PyYAML keeps the last)."""


def _unique_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict:
    keys = [loader.construct_object(key, deep=True) for key, _ in node.value]
    for i, key in enumerate(keys):
        if key in keys[:i]:
            raise yaml.MarkedYAMLError(problem=f"duplicate key {key!r}", problem_mark=node.value[i][0].start_mark)
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def load_yaml(path: Path):
    """One YAML file's data; unreadable, binary or malformed files and duplicate keys raise a one-line VariantError."""
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_StrictLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise VariantError(f"{path}: cannot read: {' '.join(str(exc).split())}") from exc


def read(path: Path, definition: str) -> dict:
    """Load one YAML file of variants/ and validate it against its definition in schema.yaml."""
    data = load_yaml(path)
    errors = sorted(_validator(path.parent / "schema.yaml", definition).iter_errors(data),
                    key=lambda e: list(e.absolute_path))
    if errors:
        where = "/".join(str(p) for p in errors[0].absolute_path) or "(top level)"
        raise VariantError(f"{path.name}: bad variant data at {where}: {errors[0].message}")
    return data


@cache
def _validator(schema_file: Path, definition: str):
    # One load() reads five files against this schema; parse it once per process.
    schema = load_yaml(schema_file)
    if not isinstance(schema, dict) or definition not in schema.get("$defs", {}):
        raise VariantError(f"{schema_file}: not the variants schema (a mapping whose $defs define {definition!r})")
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise VariantError(f"{schema_file}: invalid JSON Schema: {exc.message}") from exc
    return jsonschema.Draft202012Validator({**schema, "$ref": f"#/$defs/{definition}"})


class _Facts:
    """conda-forge facts and toolchain pairing, used to check and complete every row."""

    def __init__(self, root: Path):
        self.root = root
        self.forge = read(root / "conda-forge.yaml", "conda_forge")
        self.toolchain = read(root / "toolchain.yaml", "toolchain")

    def cuda_lines(self, platform: str, torch: str) -> list[str]:
        return [b["cuda"] for b in self.forge["pytorch_cuda_builds"][platform]
                if Version(torch) in SpecifierSet(b["torch"])]

    def pythons(self, torch: str) -> list[str]:
        return [py for entry in self.forge["pytorch_python"]
                if Version(torch) in SpecifierSet(entry["torch"]) for py in entry["python"]]

    def describe(self, platform: str) -> str:
        return ", ".join(f"CUDA {b['cuda']} for torch {b['torch']}"
                         for b in self.forge["pytorch_cuda_builds"][platform])

    def archs(self, wanted: list[str], cuda: str) -> list[str]:
        table = self.toolchain["nvcc_archs"]
        unknown = [a for a in wanted if a not in table]
        if unknown:
            raise VariantError(f"toolchain.yaml: no nvcc_archs entry for compute capability {', '.join(unknown)}")
        return [a for a in wanted if Version(table[a]["since"]) <= Version(cuda)
                and ("until" not in table[a] or Version(cuda) < Version(table[a]["until"]))]

    def toolchain_for(self, platform: str, cuda: str) -> dict:
        tc = self.toolchain
        base = {k: v for k, v in tc["platforms"][platform].items() if k != "wheel_platform"}
        base["cuda_compiler"] = tc["cuda_compiler"]
        if platform.startswith("linux-"):
            if cuda not in tc["cuda_linux"]:
                raise VariantError(f"toolchain.yaml: no compiler pairing for CUDA {cuda} on Linux; "
                                   f"known: {', '.join(tc['cuda_linux'])}")
            pair = tc["cuda_linux"][cuda]
            base.update(c_compiler_version=pair["c_compiler_version"],
                        cxx_compiler_version=pair["c_compiler_version"],
                        c_stdlib_version=pair["c_stdlib_version"])
        return base


def recipe_source(recipe: str, root: Path = ROOT) -> Path:
    """The source tree a recipe (a path relative to `root`) builds, its source.path: the package's project root."""
    path = root / recipe
    return (path.parent / load_yaml(path)["source"]["path"]).resolve()


def constants(path: Path) -> dict:
    """A Python file's top-level `NAME = literal` assignments, read without running it (the package's __init__
    imports torch)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.targets[0].id: ast.literal_eval(node.value) for node in tree.body
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Constant)}


def package_facts(spec: dict) -> tuple[str, str | None]:
    """(version, CUDA floor or None) of a package, from its sources: __version__ in its __init__.py (which
    pyproject.toml reads too) and MIN_CUDA in its archs.py."""
    package_dir = recipe_source(spec["recipe"]) / spec["import"]
    return constants(package_dir / "__init__.py")["__version__"], constants(package_dir / "archs.py").get("MIN_CUDA")


def cuda_floor_error(short: str, floor: str) -> str:
    """What a package says of a CUDA older than its floor (the sageattn3 build says the same)."""
    return f"{short.capitalize()} is only supported on CUDA {floor} and above"


@cache
def load(package: str, root: Path = VARIANTS_DIR) -> Matrix:
    """Read and validate one package's matrix; raises VariantError naming the problem."""
    if package not in PACKAGES:
        raise VariantError(f"unknown package {package!r}; supported: {', '.join(PACKAGES)}")
    spec = read(root / f"{package}.yaml", "package")
    if spec["package"] != package:
        raise VariantError(f"{package}.yaml: package: {spec['package']!r} contradicts the file it is in; "
                           f"{package}.yaml must describe {package!r}")
    current = read(root / "current.yaml", "current")
    facts = _Facts(root)
    version, min_cuda = package_facts(spec)
    if spec["arch_list"] not in spec["arch_lists"]:
        raise VariantError(f"{package}.yaml: arch_list {spec['arch_list']!r} is not one of "
                           f"{', '.join(spec['arch_lists'])}")
    rows = [("seed", r) for r in spec["seed_rows"]] + [("current", r) for r in current["rows"]]
    variants: list[Variant] = []
    unavailable: list[Unavailable] = []
    for row_set, row in rows:
        for platform in PLATFORMS:
            made = _expand(spec, version, min_cuda, facts, row_set, row, platform)
            if isinstance(made, Unavailable):
                unavailable.append(made)
            else:
                variants.extend(made)
    _check_unique(package, variants)
    profiles = {**spec["profiles"], **current["profiles"]}
    matrix = Matrix(package, version, variants, unavailable, profiles, min_cuda, spec.get("wheel_requires", {}))
    for name in profiles:
        if not matrix.select(name):
            raise VariantError(f"{package}: profile {name!r} selects no variant; check its select entries")
    return matrix


def _expand(spec: dict, version: str, min_cuda: str | None, facts: _Facts, row_set: str, row: dict, platform: str):
    package = spec["package"]
    label = f"{package} row torch {row['torch']} + CUDA {row['cuda']} on {platform}"
    mapping = row.get("conda", {}).get(platform, {})
    if "unavailable" in mapping:
        return Unavailable(package, platform, row["torch"], row["cuda"], tuple(row["python"]), mapping["unavailable"])
    torch = mapping.get("torch", row["torch"])
    cuda = mapping.get("cuda", _minor(row["cuda"]))
    for asked in {_minor(row["cuda"]), cuda}:
        if min_cuda and Version(asked) < Version(min_cuda):
            raise VariantError(f"{cuda_floor_error(spec['short'], min_cuda)} ({label} asks for CUDA {asked})")
    if cuda not in facts.cuda_lines(platform, torch):
        hint = "" if mapping else "; name a substitute under conda:" + f" {platform} or mark it unavailable"
        raise VariantError(f"{label}: conda-forge has no pytorch {torch} build with CUDA {cuda} on {platform} "
                           f"(it ships {facts.describe(platform)}){hint}")
    missing = [py for py in row["python"] if py not in facts.pythons(torch)]
    if missing:
        raise VariantError(f"{label}: conda-forge has no pytorch {torch} for Python {', '.join(missing)} "
                           f"(supported: {', '.join(facts.pythons(torch))})")
    archs = facts.archs(spec["arch_lists"][spec["arch_list"]], cuda)
    if not archs:
        raise VariantError(f"{label}: nvcc {cuda} can target none of {spec['arch_list']} archs")
    substitute = None
    if mapping:
        substitute = f"torch {torch} + CUDA {cuda} instead of torch {row['torch']} + CUDA {row['cuda']}: {mapping['why']}"
    return [Variant(package=package, version=version, short=spec["short"], import_name=spec["import"],
                    recipe=spec["recipe"], platform=platform, row_set=row_set, python=py,
                    requested_torch=row["torch"], requested_cuda=row["cuda"], torch_version=torch, cuda=cuda,
                    substitute=substitute, cuda_arch_list=";".join(archs),
                    toolchain=facts.toolchain_for(platform, cuda),
                    wheel_platform=facts.toolchain["platforms"][platform]["wheel_platform"],
                    no_wheel=no_wheel_reason(platform, _minor(torch), facts.root),
                    stable=row.get("stable_abi", False))
            for py in row["python"]]


@cache
def pypi_facts(root: Path = VARIANTS_DIR) -> dict:
    """variants/pypi.yaml: how our conda packages become wheels, and what PyPI's torch wheels are."""
    return read(root / "pypi.yaml", "pypi")


def no_wheel_reason(platform: str, torch: str, root: Path = VARIANTS_DIR) -> str | None:
    """Why a build for torch (major.minor) on a platform gets no wheel, or None: PyPI's torch there has the
    pre-C++11 string ABI, and a module built against conda-forge's torch (C++11 ABI) would not load with it."""
    spec = pypi_facts(root).get("pre_cxx11_abi", {}).get(platform)
    if spec is None or Version(torch) not in SpecifierSet(spec):
        return None
    return (f"PyPI's torch {torch} for {platform} uses the pre-C++11 C++ ABI, so a wheel built against conda-forge's "
            "torch (C++11 ABI) would not load with it: conda package only")


def _check_unique(package: str, variants: list[Variant]) -> None:
    seen: dict[tuple, Variant] = {}
    for v in variants:
        key = (v.platform, v.torch, v.cuda, v.python, v.stable)
        if key in seen:
            raise VariantError(f"{package}: {v.name} and {seen[key].name} both build torch {v.torch} + "
                               f"CUDA {v.cuda} + Python {v.python} on {v.platform}; drop or remap one")
        seen[key] = v
