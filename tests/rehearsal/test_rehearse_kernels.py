"""The rehearsal's check of sageattention's compiled modules, in the package and in the wheel: present once each,
device code for the rehearsal's arch only, and the MMA instructions their kernels are made of."""
import zipfile

import pytest

from scripts.rehearse import RehearsalError, check_kernels, check_wheel_kernels, chosen_variants

SO = ".cpython-311-x86_64-linux-gnu.so"
SOUND = {
    f"sageattention/_C_sm80{SO}": ["ELF file 1: attention.sm_120.cubin", "IMMA.16832.S8.S8 R0, R1", "HMMA.16816.F32"],
    f"sageattention/_C_sm89{SO}": ["ELF file 1: attention.sm_120.cubin", "IMMA.16832.S8.S8 R0, R1",
                                   "QMMA.16832.F32.E4M3.E4M3 R4, R8"],
}


@pytest.fixture
def cuobjdump(tmp_path):
    """A cuobjdump that answers --list-elf with a file's ELF lines and -sass with the rest of it."""
    tool = tmp_path / "cuobjdump"
    tool.write_text("#!/bin/sh\ncase \"$1\" in --list-elf) grep '^ELF' \"$2\";; -sass) grep -v '^ELF' \"$2\";; esac\n")
    tool.chmod(0o755)
    return tool


def site(where, modules):
    for rel, lines in modules.items():
        (where / rel).parent.mkdir(parents=True, exist_ok=True)
        (where / rel).write_text("\n".join(lines) + "\n")
    (where / "sageattention/__init__.py").write_text("")
    return where, [*modules, "sageattention/__init__.py"]


def test_sound_modules_pass_and_the_report_counts_the_mmas(tmp_path, cuobjdump):
    report = check_kernels("sageattention", *site(tmp_path, SOUND), cuobjdump)
    assert report == "_C_sm80 sm_120: 1× IMMA, 1× HMMA; _C_sm89 sm_120: 1× IMMA, 1× QMMA e4m3"


def test_a_missing_module_fails(tmp_path, cuobjdump):
    modules = {k: v for k, v in SOUND.items() if "sm89" not in k}
    with pytest.raises(RehearsalError, match="expected one compiled sageattention._C_sm89, found none"):
        check_kernels("sageattention", *site(tmp_path, modules), cuobjdump)


def test_device_code_for_another_arch_fails(tmp_path, cuobjdump):
    sm80 = f"sageattention/_C_sm80{SO}"
    modules = {**SOUND, sm80: [*SOUND[sm80], "ELF file 2: x.sm_90.cubin"]}
    with pytest.raises(RehearsalError, match=r"device code for \['sm_120', 'sm_90'\], expected only sm_120"):
        check_kernels("sageattention", *site(tmp_path, modules), cuobjdump)


def test_fp8_module_without_the_e4m3_mma_fails(tmp_path, cuobjdump):
    modules = {**SOUND, f"sageattention/_C_sm89{SO}": ["ELF file 1: a.sm_120.cubin", "IMMA.16832.S8.S8", "HMMA.16816"]}
    with pytest.raises(RehearsalError, match=r"_C_sm89.*SASS has no QMMA e4m3"):
        check_kernels("sageattention", *site(tmp_path, modules), cuobjdump)


def test_the_wheel_is_checked_the_same_way(tmp_path, cuobjdump):
    v = chosen_variants()[0]
    root, files = site(tmp_path / "site", SOUND)
    wheel = tmp_path / v.wheel
    with zipfile.ZipFile(wheel, "w") as whl:
        for rel in files:
            whl.write(root / rel, rel)
    assert "_C_sm89 sm_120" in check_wheel_kernels(v, wheel, cuobjdump)
    with zipfile.ZipFile(wheel, "w") as whl:
        whl.write(root / files[0], files[0])
    with pytest.raises(RehearsalError, match="_C_sm89, found none"):
        check_wheel_kernels(v, wheel, cuobjdump)


def test_the_rehearsal_expects_names_that_record_its_arch_list():
    sage2 = chosen_variants()[0]
    assert sage2.package == "sageattention" and sage2.build_string_prefix.endswith("sm120")
    assert ".sm120-" in sage2.wheel
