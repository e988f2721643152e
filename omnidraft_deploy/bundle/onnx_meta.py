"""What the bundle checks read from an ``.onnx`` file, without parsing its weights.

``onnx.load`` decodes every initializer's bytes: 2-3 s for the 1.1 GB int8 Qwen2.5-0.5B graph,
paid by every open of a bundle (the export's own opener, ``validate``, each ``run``) and twice
more by the export (``exporters.verify.reference_for``). The checks need two things only: the
model's ``metadata_props`` and the external-data location of each graph initializer. This reads
them from the protobuf wire format (https://protobuf.dev/programming-guides/encoding/) over a
memory map, stepping over every other field by its length, so the weights are never copied:

    ModelProto:  7 graph (GraphProto), 14 metadata_props (StringStringEntryProto: 1 key, 2 value)
    GraphProto:  5 initializer (TensorProto)
    TensorProto: 8 name, 13 external_data (StringStringEntryProto)

Every field of those three messages is walked (wire types 0, 1, 2 and 5; a group or a length past
its message is an error), so a truncated or foreign file is refused like ``onnx.load`` refuses it:
``ValueError`` saying where the wire format broke. What the fields in between hold (nodes, the
weights' bytes) is ONNX Runtime's to check when it creates the session.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_MODEL_GRAPH, _MODEL_METADATA = 7, 14
_GRAPH_INITIALIZER = 5
_TENSOR_NAME, _TENSOR_EXTERNAL = 8, 13
_ENTRY_KEY, _ENTRY_VALUE = 1, 2


@dataclass(frozen=True)
class OnnxMeta:
    metadata: dict[str, str]  # metadata_props, key -> value (a repeated key: the last one)
    external: dict[str, str]  # initializer name -> the file its external data is in


class _Span:
    """A message: bytes ``[start, end)`` of ``buf``."""

    def __init__(self, buf: Any, start: int, end: int) -> None:
        self.buf, self.start, self.end = buf, start, end

    def bytes(self) -> bytes:
        return bytes(self.buf[self.start : self.end])

    def text(self) -> str:
        try:
            return self.bytes().decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"a string at byte {self.start} is not UTF-8") from None


def _varint(buf: Any, pos: int, end: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= end or shift > 63:
            raise ValueError(f"a varint at byte {pos} runs past its message")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(msg: _Span) -> Iterator[tuple[int, _Span | None]]:
    """(field number, its bytes for a length-delimited field else None) of every field."""
    buf, pos, end = msg.buf, msg.start, msg.end
    while pos < end:
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ValueError(f"field number 0 at byte {pos}")
        if wire == 0:
            _, pos = _varint(buf, pos, end)
            yield number, None
            continue
        if wire == 2:
            size, pos = _varint(buf, pos, end)
            stop = pos + size
        elif wire in (1, 5):
            stop = pos + (8 if wire == 1 else 4)
        else:
            raise ValueError(f"wire type {wire} (field {number}) at byte {pos}")
        if stop > end:
            raise ValueError(f"field {number} at byte {pos} runs past its message")
        yield number, (_Span(buf, pos, stop) if wire == 2 else None)
        pos = stop


def _entry(msg: _Span) -> tuple[str, str]:
    key = value = ""
    for number, span in _fields(msg):
        if span is not None and number == _ENTRY_KEY:
            key = span.text()
        elif span is not None and number == _ENTRY_VALUE:
            value = span.text()
    return key, value


def _external_file(tensor: _Span) -> tuple[str, str | None]:
    """(initializer name, the ``location`` of its external data or None)."""
    name, location = "", None
    for number, span in _fields(tensor):
        if span is not None and number == _TENSOR_NAME:
            name = span.text()
        elif span is not None and number == _TENSOR_EXTERNAL:
            key, value = _entry(span)
            location = value if key == "location" else location
    return name, location


def _parse(model: _Span) -> OnnxMeta:
    metadata: dict[str, str] = {}
    external: dict[str, str] = {}
    for number, span in _fields(model):
        if span is not None and number == _MODEL_METADATA:
            key, value = _entry(span)
            metadata[key] = value
        elif span is not None and number == _MODEL_GRAPH:
            for g_number, g_span in _fields(span):
                if g_span is not None and g_number == _GRAPH_INITIALIZER:
                    name, location = _external_file(g_span)
                    if location is not None:
                        external[name] = location
    return OnnxMeta(metadata, external)


def read_onnx_meta(source: Path | int) -> OnnxMeta:
    """``metadata_props`` and external-data files of the ONNX model at ``source`` (a path, or an
    open file descriptor, which is left open). ``ValueError`` when it is not a readable model."""
    if isinstance(source, int):
        return _read_fd(source)
    with open(source, "rb") as f:
        return _read_fd(f.fileno())


def _read_fd(fd: int) -> OnnxMeta:
    import os

    size = os.fstat(fd).st_size
    if size == 0:
        raise ValueError("an empty file")
    with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as buf:
        return _parse(_Span(buf, 0, size))
