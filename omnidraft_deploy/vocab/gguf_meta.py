"""Fast reader of a GGUF file's header: metadata key/values and tensor shapes, no tensor data.

``gguf.GGUFReader`` builds one numpy view per array element (17 s for Qwen2.5-0.5B's 151,936
tokens and 151,387 merges); this reads the same header with ``struct`` in well under a second, so
``omnidraft-export`` can check a GGUF's architecture and vocabulary before any export work.

Layout (GGUF v2/v3, little-endian; https://github.com/ggml-org/ggml/blob/master/docs/gguf.md)::

    "GGUF" u32 version  u64 n_tensors  u64 n_kv
    n_kv x   (string key, u32 value_type, value)       string = u64 length + UTF-8 bytes
    n_tensors x (string name, u32 n_dims, u64 dims[n_dims], u32 ggml_type, u64 offset)
    padding to ``general.alignment`` (default 32), then the tensor data (offsets relative to it)

value types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool, 8 string,
9 array (u32 item type, u64 count, items), 10 u64, 11 i64, 12 f64.
"""

from __future__ import annotations

import dataclasses
import functools
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}  # fmt: skip
_MAX_COUNT = 1 << 26  # refuse absurd lengths from a damaged header before allocating


@dataclass(frozen=True)
class GGUFHeader:
    path: Path
    fields: dict[str, Any]  # key -> int / float / bool / str / list
    tensors: dict[str, tuple[int, ...]]  # tensor name -> dims as GGUF stores them (ne0 first)
    layout: dict[str, tuple[int, int]]  # tensor name -> (ggml type, absolute offset of its data)

    @property
    def architecture(self) -> str:
        return str(self.fields.get("general.architecture", ""))

    def arch_field(self, name: str, default: Any = None) -> Any:
        """``<architecture>.<name>``, e.g. ``block_count``, ``attention.head_count``."""
        return self.fields.get(f"{self.architecture}.{name}", default)


class _Cursor:
    """Reads the header from a memory map: one ``unpack_from`` per value, no file calls (the
    1.2 million strings of Qwen2.5's and SmolLM2's tokens and merges: ~1 s, not ~5)."""

    def __init__(self, buf: Any, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def unpack(self, fmt: str) -> tuple[Any, ...]:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise ValueError(f"{self.path}: GGUF header truncated")
        out = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return out

    def count(self) -> int:
        (n,) = self.unpack("<Q")
        if n > _MAX_COUNT:
            raise ValueError(f"{self.path}: GGUF header declares {n} items (damaged file?)")
        return int(n)

    def string(self) -> str:
        n = self.count()
        end = self.pos + n
        if end > len(self.buf):
            raise ValueError(f"{self.path}: GGUF header truncated")
        text = self.buf[self.pos : end].decode("utf-8", errors="replace")
        self.pos = end
        return text

    def strings(self, n: int) -> list[str]:
        """``n`` strings in a row (a token or merge table), in one tight loop."""
        buf, pos, size, out = self.buf, self.pos, len(self.buf), []
        unpack_len = struct.Struct("<Q").unpack_from
        for _ in range(n):
            if pos + 8 > size:
                raise ValueError(f"{self.path}: GGUF header truncated")
            (length,) = unpack_len(buf, pos)
            pos += 8
            if length > _MAX_COUNT or pos + length > size:
                raise ValueError(f"{self.path}: GGUF header truncated or damaged")
            out.append(buf[pos : pos + length].decode("utf-8", errors="replace"))
            pos += length
        self.pos = pos
        return out

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])[0]
        if vtype == 8:
            return self.string()
        if vtype == 9:
            (itype,) = self.unpack("<I")
            n = self.count()
            if itype in _SCALARS:  # one read for the whole array
                return list(self.unpack(f"<{n}{_SCALARS[itype][1]}"))
            if itype == 8:
                return self.strings(n)
            return [self.value(itype) for _ in range(n)]
        raise ValueError(f"{self.path}: unknown GGUF value type {vtype}")


def read_gguf_header(path: str | Path) -> GGUFHeader:
    """Metadata and tensor shapes of a GGUF file; ``ValueError`` naming the file if it is not one.

    Read once per file version and process (the export reads each GGUF's header for its vocabulary,
    context, size and name): the result is shared, so callers must not mutate its fields."""
    path = Path(path)
    st = path.stat()
    header = _read_header(path.resolve(), st.st_size, st.st_mtime_ns)
    return dataclasses.replace(header, path=path)


@functools.lru_cache(maxsize=8)
def _read_header(path: Path, size: int, mtime_ns: int) -> GGUFHeader:
    with open(path, "rb") as f:
        if size < 24 or f.read(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file (no GGUF magic)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(_Cursor(buf, path))


def _parse(c: _Cursor) -> GGUFHeader:
    c.pos = 4
    version, n_tensors, n_kv = c.unpack("<IQQ")
    if version not in (2, 3) or n_tensors > _MAX_COUNT or n_kv > _MAX_COUNT:
        raise ValueError(f"{c.path}: unsupported GGUF version {version} or damaged header")
    fields: dict[str, Any] = {}
    for _ in range(n_kv):
        key = c.string()
        (vtype,) = c.unpack("<I")
        fields[key] = c.value(vtype)
    tensors: dict[str, tuple[int, ...]] = {}
    relative: dict[str, tuple[int, int]] = {}
    for _ in range(n_tensors):
        name = c.string()
        (n_dims,) = c.unpack("<I")
        dims = c.unpack(f"<{n_dims}Q")
        tensors[name] = tuple(int(d) for d in dims)
        relative[name] = c.unpack("<IQ")  # ggml type (u32) + data offset (u64)
    align = fields.get("general.alignment", 32)
    if not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise ValueError(f"{c.path}: general.alignment {align!r} is not a power of two")
    start = -(-c.pos // align) * align
    layout = {name: (int(t), start + int(off)) for name, (t, off) in relative.items()}
    return GGUFHeader(c.path, fields, tensors, layout)
