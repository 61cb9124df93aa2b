"""Read metadata fields from a GGUF file's header with the standard library alone.

`gguf.GGUFReader` maps and parses the whole file (every tensor record and the full
vocabulary arrays: seconds), where checking `general.architecture` needs the first few
hundred bytes. This reader walks the key/value section from the start and stops at the
keys asked for.

Format (GGUF v2 and v3, little-endian; ggml's docs/gguf.md): magic ``GGUF``, uint32
version, uint64 tensor count, uint64 key/value count, then per pair a string key
(uint64 byte length + UTF-8), a uint32 value type and the value; arrays are a uint32
element type, a uint64 count and the elements.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

#: GGUF value type -> struct format of a scalar of that type.
_SCALARS = {
    0: "<B",  # UINT8
    1: "<b",  # INT8
    2: "<H",  # UINT16
    3: "<h",  # INT16
    4: "<I",  # UINT32
    5: "<i",  # INT32
    6: "<f",  # FLOAT32
    7: "<?",  # BOOL
    10: "<Q",  # UINT64
    11: "<q",  # INT64
    12: "<d",  # FLOAT64
}
_STRING, _ARRAY = 8, 9


def _read(f: BinaryIO, fmt: str):
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise ValueError("truncated GGUF header")
    return struct.unpack(fmt, data)[0]


def _string(f: BinaryIO) -> str:
    n = _read(f, "<Q")
    data = f.read(n)
    if len(data) != n:
        raise ValueError("truncated GGUF header")
    return data.decode("utf-8", errors="replace")


def _value(f: BinaryIO, vtype: int) -> Any:
    if vtype in _SCALARS:
        return _read(f, _SCALARS[vtype])
    if vtype == _STRING:
        return _string(f)
    if vtype == _ARRAY:
        etype, count = _read(f, "<I"), _read(f, "<Q")
        if etype in _SCALARS:  # skipped whole: the arrays asked for are not numeric
            f.seek(count * struct.calcsize(_SCALARS[etype]), 1)
            return None
        return [_value(f, etype) for _ in range(count)]
    raise ValueError(f"unknown GGUF value type {vtype}")


def read_fields(path: Path, keys: set[str]) -> dict[str, Any]:
    """The values of `keys` (those present) among the file's metadata, reading only up to
    the last of them. Strings come back as str, scalars as int/float/bool, string arrays
    as lists; numeric arrays are skipped (None).

    Raises:
        ValueError: not a GGUF file (bad magic), an unsupported version (v1, or a
            big-endian file), or a header cut short.
    """
    found: dict[str, Any] = {}
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file (bad magic)")
        version = _read(f, "<I")
        if version not in (2, 3):
            raise ValueError(f"{path}: unsupported GGUF version {version} (2 and 3 are read)")
        _read(f, "<Q")  # tensor count
        for _ in range(_read(f, "<Q")):
            key = _string(f)
            value = _value(f, _read(f, "<I"))
            if key in keys:
                found[key] = value
                if len(found) == len(keys):
                    break
    return found


def gguf_architecture(path: Path) -> str:
    """`general.architecture` of a GGUF file (e.g. "llama", "qwen2", "gemma3").

    Raises:
        ValueError: not a readable GGUF header, or the field is missing.
    """
    arch = read_fields(path, {"general.architecture"}).get("general.architecture")
    if not isinstance(arch, str):
        raise ValueError(f"{path}: the GGUF header has no general.architecture")
    return arch
