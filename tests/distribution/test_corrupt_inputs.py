"""Corrupt inputs get one error line naming the file and the problem (exit 2), and a batch goes on past them;
a killed build's or export's scratch files are never taken for results."""
import shutil

import pytest
import yaml

from scripts import ci, wheel_check, wheel_export
from scripts.variants import VARIANTS_DIR, VariantError, load


@pytest.fixture
def variants_copy(tmp_path):
    return shutil.copytree(VARIANTS_DIR, tmp_path / "variants")


def test_a_key_written_twice_is_refused_with_its_line(variants_copy):
    path = variants_copy / "sageattn3.yaml"
    path.write_text(path.read_text().replace("import: sageattn3\n", "import: sageattn3\nimport: sage3\n"))
    with pytest.raises(VariantError) as err:
        load("sageattn3", variants_copy)
    assert str(err.value).startswith(f"{path}: cannot read: ")
    assert "duplicate key 'import'" in str(err.value) and "line 5" in str(err.value)
    assert "\n" not in str(err.value)


def test_duplicate_keys_are_found_in_nested_mappings(variants_copy):
    path = variants_copy / "current.yaml"
    path.write_text(path.read_text().replace("  pytorch29:", "  pytorch212: {description: x, select: [{set: current}]}\n"
                                             "  pytorch29:"))
    with pytest.raises(VariantError, match="current.yaml: cannot read: .*duplicate key 'pytorch212'"):
        load("sageattention", variants_copy)


def test_a_package_that_contradicts_its_file_is_refused(variants_copy):
    path = variants_copy / "sageattn3.yaml"
    data = yaml.safe_load(path.read_text())
    data["package"] = "sageattention"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(VariantError, match="sageattn3.yaml: package: 'sageattention' contradicts the file it is in"):
        load("sageattn3", variants_copy)


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe"), "cannot read: 'utf-8' codec can't decode"),
    (lambda p: p.unlink(), "cannot read: .*No such file"),
    (lambda p: p.write_text("just a string\n"), "not the variants schema"),
    (lambda p: p.write_text("$defs: {package: {type: 12}}\n"), "invalid JSON Schema"),
])
def test_a_binary_missing_or_wrong_schema_is_named(variants_copy, damage, message):
    damage(variants_copy / "schema.yaml")
    with pytest.raises(VariantError, match=f"schema.yaml: {message}"):
        load("sageattn3", variants_copy)


def test_a_binary_variant_file_is_named(variants_copy):
    (variants_copy / "current.yaml").write_bytes(bytes(range(256)))
    with pytest.raises(VariantError, match="current.yaml: cannot read: 'utf-8' codec"):
        load("sageattn3", variants_copy)


def test_export_batch_goes_past_a_corrupt_package(channel, tmp_path, capsys):
    good = [path for _, path in channel[1].values()]
    corrupt = tmp_path / "sageattn3-1.0.0-cu129torch28py312h0_0.conda"
    corrupt.write_bytes(good[0].read_bytes()[:300])  # a truncated download
    out = tmp_path / "wheels"
    assert wheel_export.main([str(good[0]), str(corrupt), str(good[1]), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {corrupt}: not a readable conda package")
    assert len(list(out.glob("*.whl"))) == 2


def test_export_refuses_a_package_without_license_files(tmp_path):
    from rattler_build import assemble_package
    staged = tmp_path / "staged" / "lib/python3.12/site-packages/sageattn3"
    staged.mkdir(parents=True)
    (staged / "__init__.py").write_text("")
    out = assemble_package(name="sageattn3", version="1.0.0", target_platform="linux-64",
                           build_string="cu129torch28py312h0123abc_0", output_dir=tmp_path / "chan",
                           files_dir=tmp_path / "staged", depends=["pytorch >=2.8,<2.9.0a0"])
    with pytest.raises(wheel_export.ExportError, match=r"\.conda: the package has no license files"):
        wheel_export.export(out.path, tmp_path / "wheels", manylinux=False)


def test_wheel_check_names_a_corrupt_wheel_and_exits_2(wheels, tmp_path, capsys):
    good = wheels[("2.8", "12.9")]
    corrupt = tmp_path / good.name.replace("280.129", "270.129")
    corrupt.write_bytes(b"PK\x03\x04 not really a zip")
    assert wheel_check.main([str(corrupt), str(good), "--no-install"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {corrupt}: unreadable wheel:")


def test_scratch_of_a_killed_build_or_export_is_not_an_output(tmp_path):
    v = load("sageattn3").select("default", "linux-64")[0]
    dist = tmp_path / "dist"
    scratch_wheel = dist / "wheels" / ".partial-k1ll3d" / v.wheel
    scratch_conda = dist / "channel" / ".build-k1ll3d" / v.platform / f"{v.package}-{v.version}-{v.build_string_prefix}h0_0.conda"
    for path in (scratch_wheel, scratch_conda):
        path.parent.mkdir(parents=True)
        path.write_bytes(b"half written")
    assert ci.outputs(v, dist) == ([], [])
    assert ci.build_problems(v, dist)[0] == f"expected one wheel named {v.wheel}, found 0"
    with pytest.raises(ci.CIError, match="no .conda packages under"):
        ci.upload_channel(dist, "sageattention")
    finished = dist / "channel" / v.platform / scratch_conda.name
    finished.parent.mkdir(parents=True)
    finished.write_bytes(b"done")
    assert ci.outputs(v, dist) == ([], [finished])
