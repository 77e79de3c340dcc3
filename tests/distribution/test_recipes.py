"""Both recipes and pixi.toml: schema-valid, and every variant renders offline with rattler-build's engine."""
import json
import re
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml

from scripts.render import render
from scripts.variants import PACKAGES, ROOT, load

SCHEMAS = ROOT.parent / "shared" / "schemas"
RECIPES = ["recipes/sageattention/recipe.yaml", "recipes/sageattn3/recipe.yaml"]
CUDA_DEV = ["cuda-cudart-dev", "libcublas-dev", "libcusparse-dev", "libcusolver-dev"]


def validate(document, schema_name):
    schema = json.loads((SCHEMAS / schema_name).read_text())
    errors = [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(document)]
    assert errors == []


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_matches_the_v1_schema(recipe):
    validate(yaml.safe_load((ROOT / recipe).read_text()), "rattler-recipe.schema.json")


def test_pixi_manifest_matches_the_schema_and_has_the_tasks():
    manifest = tomllib.loads((ROOT / "pixi.toml").read_text())
    validate(manifest, "pixi-manifest.schema.json")
    assert manifest["workspace"]["channels"] == ["conda-forge"]
    assert manifest["workspace"]["platforms"] == ["linux-64", "linux-aarch64", "win-64"]
    tasks = {name: task for feature in manifest["feature"].values() for name, task in feature.get("tasks", {}).items()}
    assert {"build-sage2", "build-sage3", "matrix", "export-wheels", "check-wheels", "index", "test", "bench"} <= set(tasks)
    for task, package in (("build-sage2", "sageattention"), ("build-sage3", "sageattn3")):
        assert tasks[task]["args"] == [{"arg": "profile", "default": "default"}]
        assert f"--package {package} --profile {{{{ profile }}}}" in tasks[task]["cmd"]
    assert tasks["bench"]["cmd"] == "python -m sageattention.bench.run"
    pypi = manifest["feature"]["test"]["pypi-dependencies"]
    assert pypi["sageattention"] == {"path": ".", "editable": True, "extras": ["test"]}
    assert pypi["sageattn3"] == {"path": "./sageattention3_blackwell", "editable": True}


@pytest.fixture(scope="module")
def rendered():
    variants = load("sageattention").variants + load("sageattn3").variants
    return render(variants)


def test_every_variant_renders_and_none_is_skipped(rendered):
    assert len(rendered) == len(load("sageattention").variants) + len(load("sageattn3").variants)
    assert [v.name for v, out in rendered.items() if out is None] == []


def test_recipes_build_the_version_and_name_the_variants_file_says(rendered):
    # the package's __version__ (scripts/variants.py reads it) versions the release (tags, wheel names) and the recipe
    for v, out in rendered.items():
        assert (out["recipe"]["package"]["name"], out["recipe"]["package"]["version"]) == (v.package, v.version)


def test_build_strings_encode_cuda_torch_python_and_hash(rendered):
    for v, out in rendered.items():
        string = out["recipe"]["build"]["string"]
        assert re.fullmatch(rf"{v.build_string_prefix}h[0-9a-f]{{7}}_0", string), (v.name, string)
    strings = [out["recipe"]["build"]["string"] for out in rendered.values()]
    assert any(s.startswith("cu129torch28py312h") for s in strings)
    assert any(s.startswith("cu130torch210py314h") for s in strings)
    assert any(s.startswith("cu130torch210uppy312h") for s in strings)


def test_requirements_pin_the_variant(rendered):
    for v, out in rendered.items():
        req = out["recipe"]["requirements"]
        # sageattention's binding includes only c10's CUDA headers: no cuBLAS/cuSPARSE/cuSOLVER headers needed.
        cuda_dev = CUDA_DEV if v.package == "sageattn3" else CUDA_DEV[:1]
        assert req["host"] == ["python", "pip", "setuptools", f"pytorch {v.torch}.*", "pytorch * cuda*",
                               f"cuda-version {v.cuda}.*", *cuda_dev], v.name
        triton = ["triton"] if v.platform.startswith("linux-") else []
        # A stable-ABI build runs under its torch and every newer one: pytorch's run export (its minor) is dropped.
        stable = [f"pytorch >={v.torch}"] if v.stable else []
        assert req["run"] == ["python", "pytorch * cuda*", *stable, *triton], v.name
        assert req.get("ignore_run_exports", {}).get("by_name", []) == (["pytorch"] if v.stable else []), v.name
        build = req["build"]
        assert f"cuda-nvcc_{v.platform} {v.cuda}.*" in build
        if v.platform.startswith("linux-"):
            gcc = v.toolchain["c_compiler_version"]
            assert build[:2] == [f"gcc_{v.platform} {gcc}.*", f"gxx_{v.platform} {gcc}.*"]
            assert f"sysroot_{v.platform} {v.toolchain['c_stdlib_version']}.*" in build
        else:
            assert build[:2] == ["vs2022_win-64", "vs2022_win-64"]


def test_the_recipes_render_for_linux_aarch64_with_its_own_toolchain(rendered):
    # GH200, GB200 and DGX Spark are aarch64 machines; nothing in the recipes may assume x86_64.
    for package in PACKAGES:
        arm = {v: out for v, out in rendered.items() if v.package == package and v.platform == "linux-aarch64"}
        assert arm and all(out is not None for out in arm.values()), package
        for v, out in arm.items():
            assert out["build_configuration"]["target_platform"] == "linux-aarch64"
            text = json.dumps(out["recipe"])
            assert "x86_64" not in text and "linux-64" not in text, v.name
            assert v.wheel.endswith("-linux_aarch64.whl")


def test_script_forwards_arch_list_and_jobs(rendered):
    for v, out in rendered.items():
        script = out["recipe"]["build"]["script"]
        assert script["env"] == {"SAGE_BUILD_CUDA": "1", "TORCH_CUDA_ARCH_LIST": v.cuda_arch_list, "MAX_JOBS": "4",
                                 "SAGE_STABLE_ABI": "1" if v.stable else "0"}
        assert script["content"] == "python -m pip install . -vv --no-deps --no-build-isolation"
        assert out["build_configuration"]["variant"]["cuda_arch_list"] == v.cuda_arch_list


def test_a_build_for_other_archs_gets_another_name():
    # issue 19: two packages with different device code never share a name (conda build string, hence wheel name).
    arch_list = " 9.0a;12.0+PTX "
    chosen = [next(v for v in load(p).variants if v.platform == "linux-64" and v.cuda == "13.0").with_arch_list(
        arch_list) for p in PACKAGES]
    for built, out in render(chosen).items():
        assert built.build_string_prefix == f"{built.with_arch_list(None).build_string_prefix}sm90a.120ptx"
        assert re.fullmatch(rf"{built.build_string_prefix}h[0-9a-f]{{7}}_0", out["recipe"]["build"]["string"]), v.name
        assert out["recipe"]["build"]["script"]["env"]["TORCH_CUDA_ARCH_LIST"] == arch_list.strip()


def test_package_tests_import_and_pip_check(rendered):
    for v, out in rendered.items():
        (test,) = out["recipe"]["tests"]
        assert test["python"]["imports"] == [v.import_name]
        # rattler-build leaves out pip_check when it is the default (true).
        assert test["python"].get("pip_check", True) is v.platform.startswith("linux-")


def test_recipe_source_paths_point_at_the_packages():
    assert yaml.safe_load((ROOT / RECIPES[0]).read_text())["source"]["path"] == "../.."
    assert yaml.safe_load((ROOT / RECIPES[1]).read_text())["source"]["path"] == "../../sageattention3_blackwell"
    assert (ROOT / "recipes/sageattention/../../pyproject.toml").resolve() == Path(ROOT / "pyproject.toml")
