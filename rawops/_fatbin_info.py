"""Read which architectures a fatbin holds, without cuobjdump.

A fatbin is a header (magic 0xBA55ED50, u16 version, u16 header size, u64 body size)
followed by entries, each with its own header: u16 kind (1 PTX, 2 ELF/SASS), u16 version,
u32 header size, u64 payload size, ..., u32 SM version at offset 28.
"""
import struct

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX = 1
KIND_ELF = 2


def fatbin_entries(data):
    """[(kind, sm)] of every entry; kind is 'sass' or 'ptx'."""
    magic, _, header_size, body_size = struct.unpack_from("<IHHQ", data, 0)
    if magic != FATBIN_MAGIC:
        raise ValueError("not a fatbin (bad magic)")
    entries = []
    offset, end = header_size, header_size + body_size
    while offset + 32 <= end:
        kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, offset)
        sm = struct.unpack_from("<I", data, offset + 28)[0]
        if kind not in (KIND_PTX, KIND_ELF) or entry_header == 0:
            break
        entries.append(("ptx" if kind == KIND_PTX else "sass", sm))
        offset += entry_header + payload
    return entries


def fatbin_architectures(path):
    """'sm_75 sm_80 ... compute_120' for a fatbin file."""
    with open(path, "rb") as f:
        entries = fatbin_entries(f.read())
    return [f"sm_{sm}" if kind == "sass" else f"compute_{sm}" for kind, sm in entries]
