"""An ELF relocatable object holding one block of read-only data under one global symbol: how
a library's packed imports (every weight) reach the linker without an assembler pass.

The layout is the System V ELF-64 one (little-endian): the file header, the data, then a symbol
table, its string table and the section names, and the section headers last. What the assembler
would write for ``.section S,"a"; .globl sym; sym: .incbin "file"``, less its copy of the file.
"""

from __future__ import annotations

import struct

import numpy as np

#: ``e_machine`` of the architectures tvmfuse links libraries for (``uname -m`` spelling).
MACHINES = {"x86_64": 62, "aarch64": 183}

_HEADER = struct.Struct("<4s5B7xHHIQQQIHHHHHH")  # Elf64_Ehdr
_SECTION = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr
_SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym
_PROGBITS, _SYMTAB, _STRTAB = 1, 2, 3
_SHF_ALLOC = 0x2
#: x86-64's flag for a section addressed with 64-bit offsets (``.lrodata``).
_SHF_X86_64_LARGE = 0x10000000
#: The alignment of the data: a cache line, as TVM aligns the tensors it loads from it.
ALIGN = 64


def write_data_object(path: str, data: np.ndarray, symbol: str, arch: str, *,
                      section: str = ".rodata") -> None:
    """Write ``data``'s bytes to the object ``path`` as ``symbol`` (global, an object of the
    data's size) in the allocated read-only ``section`` (``.lrodata``: x86-64's large one)."""
    if arch not in MACHINES:
        raise ValueError(f"no ELF machine number for {arch}")
    data = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    names = [section, ".symtab", ".strtab", ".shstrtab", ".note.GNU-stack"]
    shstrtab = b"\0" + b"".join(n.encode() + b"\0" for n in names)
    name_at = {n: shstrtab.index(b"\0" + n.encode() + b"\0") + 1 for n in names}
    strtab = b"\0" + symbol.encode() + b"\0"
    symbols = (bytes(_SYMBOL.size)  # the null symbol
               + _SYMBOL.pack(0, 3, 0, 1, 0, 0)  # the section's own (local, STT_SECTION)
               + _SYMBOL.pack(1, (1 << 4) | 1, 0, 1, 0, data.size))  # global STT_OBJECT
    data_at = ALIGN
    symbols_at = _round_up(data_at + data.size, 8)
    strtab_at = symbols_at + len(symbols)
    shstrtab_at = strtab_at + len(strtab)
    sections_at = _round_up(shstrtab_at + len(shstrtab), 8)
    flags = _SHF_ALLOC | (_SHF_X86_64_LARGE if section == ".lrodata" else 0)
    sections = [
        bytes(_SECTION.size),
        _SECTION.pack(name_at[section], _PROGBITS, flags, 0, data_at, data.size, 0, 0, ALIGN, 0),
        # sh_link: the string table's index; sh_info: the first global symbol's
        _SECTION.pack(name_at[".symtab"], _SYMTAB, 0, 0, symbols_at, len(symbols), 3, 2, 8,
                      _SYMBOL.size),
        _SECTION.pack(name_at[".strtab"], _STRTAB, 0, 0, strtab_at, len(strtab), 0, 0, 1, 0),
        _SECTION.pack(name_at[".shstrtab"], _STRTAB, 0, 0, shstrtab_at, len(shstrtab), 0, 0, 1,
                      0),
        # no code needs an executable stack
        _SECTION.pack(name_at[".note.GNU-stack"], _PROGBITS, 0, 0, shstrtab_at, 0, 0, 0, 1, 0),
    ]
    header = _HEADER.pack(b"\x7fELF", 2, 1, 1, 0, 0,  # 64-bit, little-endian, version 1
                          1, MACHINES[arch], 1, 0, 0, sections_at, 0,  # ET_REL
                          _HEADER.size, 0, 0, _SECTION.size, len(sections), 4)
    with open(path, "wb") as out:
        out.write(header)
        out.seek(data_at)
        data.tofile(out)
        out.seek(symbols_at)
        out.write(symbols + strtab + shstrtab)
        out.seek(sections_at)
        out.write(b"".join(sections))


def _round_up(offset: int, alignment: int) -> int:
    return (offset + alignment - 1) // alignment * alignment
