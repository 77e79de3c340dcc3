"""The rehearsal's checks of a built package: its contents, its build script's environment, its CUDA archs."""
import dataclasses
import json

import pytest
import yaml

from scripts import rehearse
from scripts.rehearse import ARCH, RehearsalError, check_contents, has_cuda_sources


def extracted_package(where, v, files, env=None):
    """An extracted .conda as rattler-build lays it out: info/paths.json, the rendered recipe, site-packages files."""
    site = f"lib/python{v.python}/site-packages"
    for rel in files:
        (where / site / rel).parent.mkdir(parents=True, exist_ok=True)
        (where / site / rel).write_text("")
    (where / "info/recipe").mkdir(parents=True)
    (where / "info/paths.json").write_text(json.dumps({"paths": [{"_path": f"{site}/{f}"} for f in files]}))
    script_env = env or {"SAGE_BUILD_CUDA": "1", "TORCH_CUDA_ARCH_LIST": ARCH, "MAX_JOBS": "2"}
    rendered = {"recipe": {"build": {"script": {"env": script_env}}}}
    (where / "info/recipe/rendered_recipe.yaml").write_text(yaml.safe_dump(rendered))
    return where


def cuobjdump(where, *cubins):
    """A cuobjdump that lists the given cubins for every file."""
    tool = where / "cuobjdump"
    lines = [f"echo 'ELF file    {i}: _C.{i}.{c}.cubin'\n" for i, c in enumerate(cubins, 1)]
    tool.write_text("#!/bin/sh\n" + "".join(lines))
    tool.chmod(0o755)
    return tool


OWN = ["sageattn3/__init__.py", "sageattn3/_C.cpython-311-x86_64-linux-gnu.so", "sageattn3-1.0.0.dist-info/METADATA"]


def test_a_sound_package_passes(tmp_path, variant):
    pkg = extracted_package(tmp_path / "pkg", variant, OWN)
    assert "sm_120" in check_contents(variant, pkg, 2, cuobjdump(tmp_path, "sm_120a"))


def test_a_package_shipping_another_package_fails(tmp_path, variant):
    # What the first rehearsal found: setuptools' include "sageattention*" also took sageattention3_blackwell.
    pkg = extracted_package(tmp_path / "pkg", variant, [*OWN, "sageattention3_blackwell/setup.py"])
    with pytest.raises(RehearsalError, match="ships \\['sageattention3_blackwell'\\]"):
        check_contents(variant, pkg, 2, cuobjdump(tmp_path, "sm_120a"))


def test_arch_list_that_did_not_reach_the_kernels_fails(tmp_path, variant):
    pkg = extracted_package(tmp_path / "pkg", variant, OWN)
    with pytest.raises(RehearsalError, match="expected only sm_120"):
        check_contents(variant, pkg, 2, cuobjdump(tmp_path, "sm_100a", "sm_120a"))


def test_build_script_env_without_the_callers_values_fails(tmp_path, variant):
    env = {"SAGE_BUILD_CUDA": "1", "TORCH_CUDA_ARCH_LIST": "10.0;12.0", "MAX_JOBS": "4"}
    pkg = extracted_package(tmp_path / "pkg", variant, OWN, env)
    with pytest.raises(RehearsalError, match="not TORCH_CUDA_ARCH_LIST=12.0 MAX_JOBS=2"):
        check_contents(variant, pkg, 2, cuobjdump(tmp_path, "sm_120a"))


def test_cuda_sources_without_device_code_fail(tmp_path, variant):
    pkg = extracted_package(tmp_path / "pkg", variant, [f for f in OWN if not f.endswith(".so")])
    with pytest.raises(RehearsalError, match="holds no device code"):
        check_contents(variant, pkg, 2, cuobjdump(tmp_path))


def test_cuda_sources_are_the_recipes_own(tmp_path, monkeypatch, variant):
    (tmp_path / "recipes/pkg").mkdir(parents=True)
    (tmp_path / "recipes/pkg/recipe.yaml").write_text("source:\n  path: ../..\n")
    (tmp_path / "nested/csrc").mkdir(parents=True)  # another package's kernels, like sageattention3_blackwell's
    (tmp_path / "nested/pyproject.toml").write_text("")
    (tmp_path / "nested/csrc/k.cu").write_text("")
    monkeypatch.setattr(rehearse, "ROOT", tmp_path)
    v = dataclasses.replace(variant, recipe="recipes/pkg/recipe.yaml")
    assert not has_cuda_sources(v)
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc/k.cu").write_text("")
    assert has_cuda_sources(v)


def test_sageattn3_has_cuda_sources(variant):
    assert has_cuda_sources(variant)


def test_the_package_must_carry_its_sources_license(tmp_path, variant):
    pkg = extracted_package(tmp_path / "pkg", variant, OWN)
    with pytest.raises(RehearsalError, match="info/licenses/LICENSE is missing or differs"):
        rehearse.check_license(variant, pkg)
    (pkg / "info/licenses").mkdir()
    (pkg / "info/licenses/LICENSE").write_bytes((rehearse.recipe_source(variant) / "LICENSE").read_bytes())
    assert rehearse.check_license(variant, pkg) == "info/licenses/LICENSE = sageattention3_blackwell/LICENSE"
    (pkg / "info/licenses/LICENSE").write_text("All rights reserved.\n")
    with pytest.raises(RehearsalError, match="differs from"):
        rehearse.check_license(variant, pkg)
