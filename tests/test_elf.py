import subprocess

import numpy as np
import pytest

from tvmfuse.elf import write_data_object


def _tool(*args: str) -> str:
    return subprocess.run(args, capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize(("arch", "machine", "section"), [
    ("x86_64", "X86-64", ".rodata"), ("x86_64", "X86-64", ".lrodata"),
    ("aarch64", "AArch64", ".rodata")])
def test_the_object_holds_the_bytes_under_the_symbol(tmp_path, arch, machine, section):
    """binutils read the object as the assembler's: its machine, a global object symbol of the
    data's size in the section, and the section's bytes the data's (a length no alignment
    divides)."""
    data = np.random.default_rng(0).integers(0, 256, 1001).astype(np.uint8)
    obj = tmp_path / "blob.o"
    write_data_object(str(obj), data, "blob_symbol", arch, section=section)
    assert machine in _tool("readelf", "-h", str(obj))
    symbol = next(line.split() for line in _tool("readelf", "-sW", str(obj)).splitlines()
                  if line.endswith(" blob_symbol"))
    assert symbol[2:5] == ["1001", "OBJECT", "GLOBAL"]
    sections = _tool("readelf", "-SW", str(obj))
    assert f"[ 1] {section} " in sections and ".note.GNU-stack" in sections
    _tool("objcopy", "-I", "elf64-little", "-O", "binary", f"--only-section={section}", str(obj),
          str(tmp_path / "got.bin"))
    assert (tmp_path / "got.bin").read_bytes() == data.tobytes()


def test_an_architecture_without_a_machine_number_is_refused(tmp_path):
    with pytest.raises(ValueError, match="riscv64"):
        write_data_object(str(tmp_path / "x.o"), np.zeros(4, np.uint8), "s", "riscv64")
