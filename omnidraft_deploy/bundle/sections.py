"""Sections of a bundle manifest and the field checks they share (schema: ``bundle.manifest``).

``GraphInfo`` describes one graph, ``FileEntry`` one listed file, ``TargetInfo`` one target of a
multi-target bundle (schema 2). Each validates its own types and ranges on construction
(``validate``); ``manifest.Manifest.validate`` does the cross-checks between sections. Every
failure is a ``ValueError`` naming the field; ``manifest.Manifest.from_json`` turns it into a
``BundleError`` naming the file.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field

MAX_FILE_BYTES = 1 << 40
MAX_KV_BYTES = 64 << 30  # fp32 K + V of one graph at max_seq_len
HEX64 = re.compile(r"[0-9a-f]{64}")
REL_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")


def check_int(where: str, value: object, lo: int, hi: int) -> int:
    if type(value) is not int:
        raise ValueError(
            f"field {where}: expected an integer, got {type(value).__name__} {value!r}"
        )
    if not lo <= value <= hi:
        raise ValueError(f"field {where}: {value} outside [{lo}, {hi}]")
    return value


def check_str(where: str, value: object, choices: list[str] | None = None) -> str:
    if type(value) is not str or not value or len(value) > 256:
        raise ValueError(f"field {where}: expected a non-empty string, got {value!r:.80}")
    if choices is not None and value not in choices:
        raise ValueError(f"field {where}: {value!r} not one of {choices}")
    return value


def check_relpath(where: str, rel: object) -> str:
    """A plain relative path inside the bundle: no '..', no absolute path, no odd characters."""
    parts = check_str(where, rel).split("/")
    if len(parts) > 4 or not all(REL_PART.fullmatch(p) for p in parts) or ".." in parts:
        raise ValueError(f"field {where}: {rel!r} is not a plain relative path inside the bundle")
    return str(rel)


@dataclass(frozen=True)
class GraphInfo:
    file: str
    preset: str
    family: str
    tokenizer: str
    vocab_size: int
    max_seq_len: int
    seq_len: int | None  # None: dynamic sequence dim; int: static T (NPU graphs)
    n_layers: int
    n_kv_heads: int
    head_dim: int
    quantization: str
    parity: dict[str, float] = field(default_factory=dict)
    # static-T graphs: ``<role>_decode.onnx``, the same function at T = 1 (one-token calls)
    decode_file: str | None = None

    def __post_init__(self) -> None:
        self.validate("graph")

    @staticmethod
    def decode_name(role: str) -> str:
        """The file of ``role``'s T = 1 twin (the only name a manifest accepts for it)."""
        return f"{role}_decode.onnx"

    def decode_info(self) -> GraphInfo:
        """The decode graph's own description: this one at ``decode_file`` with T = 1."""
        if self.decode_file is None:
            raise ValueError(f"{self.file} has no decode graph")
        return dataclasses.replace(self, file=self.decode_file, seq_len=1, decode_file=None)

    def validate(self, where: str) -> None:
        """Types and ranges of this section alone; ``Manifest.validate`` does the cross-checks."""
        check_relpath(f"{where}.file", self.file)
        if self.decode_file is not None:
            check_relpath(f"{where}.decode_file", self.decode_file)
        for name in ("preset", "family", "tokenizer"):
            check_str(f"{where}.{name}", getattr(self, name))
        check_int(f"{where}.vocab_size", self.vocab_size, 1, 1 << 24)
        check_int(f"{where}.max_seq_len", self.max_seq_len, 8, 131072)
        if self.seq_len is not None:
            check_int(f"{where}.seq_len", self.seq_len, 1, self.max_seq_len)
        check_int(f"{where}.n_layers", self.n_layers, 1, 1024)
        check_int(f"{where}.n_kv_heads", self.n_kv_heads, 1, 1024)
        check_int(f"{where}.head_dim", self.head_dim, 1, 4096)
        check_str(f"{where}.quantization", self.quantization)
        kv = 2 * 4 * self.n_layers * self.n_kv_heads * self.head_dim * self.max_seq_len
        if kv > MAX_KV_BYTES:
            raise ValueError(f"field {where}: a {kv / 2**30:.0f} GiB KV cache is implausible")
        if type(self.parity) is not dict or len(self.parity) > 16:
            raise ValueError(f"field {where}.parity: expected a small object")
        for key, value in self.parity.items():
            ok = type(value) in (int, float) and math.isfinite(value) and value >= 0
            if not (REL_PART.fullmatch(str(key)) and ok):
                raise ValueError(
                    f"field {where}.parity.{key}: {value!r} is not a finite number >= 0"
                )


@dataclass(frozen=True)
class FileEntry:
    sha256: str
    size: int
    role: str

    def __post_init__(self) -> None:
        self.validate("file")

    def validate(self, where: str) -> None:
        if type(self.sha256) is not str or not HEX64.fullmatch(self.sha256):
            raise ValueError(f"field {where}.sha256: {self.sha256!r:.80} is not 64 lowercase hex")
        check_int(f"{where}.size", self.size, 0, MAX_FILE_BYTES)
        check_str(f"{where}.role", self.role)


@dataclass(frozen=True)
class TargetInfo:
    """One target of a multi-target bundle: its graph and the files pairing it with the drafter."""

    graph: GraphInfo  # file: targets/<name>/target.<ext>
    mapping_hash: str  # content hash of its vocabulary map (``VocabMapper.content_hash``)
    vocab_map: str  # maps/<hex16>.bin, shared by the targets of one vocabulary
    ngram_cache: str  # targets/<name>/ngram_cache.bin
    tokenizer: str  # folder of its tokenizer files: targets/<name>/target_tokenizer
    expected: str  # targets/<name>/expected.json (``checks.expected``)

    def __post_init__(self) -> None:
        self.validate("target")

    def validate(self, where: str) -> None:
        if type(self.graph) is not GraphInfo:
            raise ValueError(f"field {where}.graph: not a graph description")
        if type(self.mapping_hash) is not str or not HEX64.fullmatch(self.mapping_hash):
            raise ValueError(f"field {where}.mapping_hash: {self.mapping_hash!r:.80} is not 64 "
                             "lowercase hex")  # fmt: skip
        for name in ("vocab_map", "ngram_cache", "tokenizer", "expected"):
            check_relpath(f"{where}.{name}", getattr(self, name))


def check_model(where: str, g: GraphInfo) -> None:
    """``preset`` is a preset whose family and tokenizer ``g`` repeats, or (weights exported with
    no preset) the model's own name: a plain identifier with a known family and tokenizer."""
    from omnidraft_deploy.catalog.presets import PRESETS, Family
    from omnidraft_deploy.catalog.tokenizers import IDS as TOKENIZERS

    spec = PRESETS.get(g.preset)
    if spec is None and not REL_PART.fullmatch(g.preset):
        raise ValueError(f"field {where}.preset: {g.preset!r:.80} is neither a preset nor a "
                         "model's own name (letters, digits, '.', '_', '-')")  # fmt: skip
    families = [f.value for f in Family] if spec is None else [spec.family.value]
    check_str(f"{where}.family", g.family, families)
    check_str(
        f"{where}.tokenizer", g.tokenizer, sorted(TOKENIZERS) if spec is None else [spec.tokenizer]
    )
