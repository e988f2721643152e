"""Target-only output recorded at export time: the independent reference ``validate`` checks.

At export, the eager fp32 target (the user's own weights, loaded by ``resolve.load``) decodes
the shipped prompt set greedily, target-only, and ``expected.json`` records, per prompt, the text,
the ids the bundle's tokenizer gives it (cut to fit the graphs' ``max_seq_len`` with the new
tokens) and the ids the target produced, plus the decoded text::

    {"version": 1, "max_new_tokens": 16, "vocab_limit": 151665, "eos_ids": [151643, 151645],
     "prompts": [{"task": "code", "text": "def fib(n):", "prompt_ids": [...],
                  "output_ids": [...], "output_text": "..."}]}

``validate`` later compares the bundle's runtime against these ids without loading any eager model
or reading any path from the manifest, so a bundle validates wherever it is copied, and a runtime
that merely agrees with itself cannot pass. The file is listed in the manifest (role
``expected``) like every other bundle file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from omnidraft_deploy.protocols import CausalLM, TokenizerLike

EXPECTED_FILE = "expected.json"
EXPECTED_ROLE = "expected"
VERSION = 1
DEFAULT_TOKENS = 16  # validate's default


def record_expected(
    target: CausalLM, tokenizer: TokenizerLike, *, max_new_tokens: int = DEFAULT_TOKENS,
    vocab_limit: int | None = None, progress: Any = None, n_prompts: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Greedy target-only decoding of the shipped prompts (``progress``: wraps the prompt loop;
    ``n_prompts``: that many of them, spread over the tasks, ``catalog.prompts.spread``; None:
    all)."""
    from omnidraft_deploy.catalog.prompts import load_prompts, spread
    from omnidraft_deploy.speculative.decoder import DecodeConfig, generate_target_only

    limit = vocab_limit or tokenizer.vocab_size
    cfg = DecodeConfig(max_new_tokens=max_new_tokens, eos_ids=tokenizer.eos_ids, vocab_limit=limit)
    prompts: Iterable[Any] = spread(load_prompts(), n_prompts)
    rows = []
    for p in progress(prompts) if progress else prompts:
        ids = tokenizer.encode(p.text)[: max(1, target.max_seq_len - max_new_tokens)]  # fits
        out, _ = generate_target_only(target, ids, cfg)
        rows.append({"task": p.task, "text": p.text, "prompt_ids": ids, "output_ids": out,
                     "output_text": tokenizer.decode(out)})  # fmt: skip
    return {"version": VERSION, "max_new_tokens": max_new_tokens, "vocab_limit": limit,
            "eos_ids": list(tokenizer.eos_ids), "prompts": rows}  # fmt: skip


def to_bytes(doc: dict[str, Any]) -> bytes:
    return (json.dumps(doc, ensure_ascii=False, indent=1) + "\n").encode("utf-8")


MAX_PROMPTS = 1024
MAX_TOKENS = 1 << 16  # max_new_tokens, and ids in one row
MAX_IDS = 1 << 24  # the manifest's bound on a vocabulary
FIELDS = {"version": True, "max_new_tokens": True, "prompts": True, "vocab_limit": False,
          "eos_ids": False}  # name -> required  # fmt: skip
ROW_FIELDS = {"task": True, "prompt_ids": True, "output_ids": True, "text": False,
              "output_text": False}  # fmt: skip


def _fields(where: str, obj: object, fields: dict[str, bool]) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise ValueError(f"{where or 'the file'} is not a JSON object")
    unknown = sorted(set(obj) - set(fields))
    missing = [k for k, required in fields.items() if required and k not in obj]
    prefix = f"{where}." if where else ""
    if unknown or missing:
        raise ValueError(f"unknown fields {unknown} in {where or 'the file'}" if unknown
                         else f"field {prefix}{missing[0]} missing")  # fmt: skip
    return obj


def _int(where: str, value: object, lo: int, hi: int) -> int:
    if type(value) is not int:  # a bool or a float is not an integer here
        raise ValueError(f"field {where}: expected an integer, got {value!r:.40}")
    if not lo <= value <= hi:
        raise ValueError(f"field {where}: {value} outside [{lo}, {hi}]")
    return value


def _ids(where: str, value: object, vocab: int, lo: int = 0) -> list[int]:
    if type(value) is not list or not lo <= len(value) <= MAX_TOKENS:
        raise ValueError(f"field {where}: expected a list of {lo} to {MAX_TOKENS} ids")
    return [_int(f"{where}[{i}]", v, 0, vocab - 1) for i, v in enumerate(value)]


def _text(where: str, value: object) -> str:
    if type(value) is not str:
        raise ValueError(f"field {where}: expected a string, got {type(value).__name__}")
    return value


def _row(where: str, row: object, vocab: int, max_new: int) -> dict[str, Any]:
    row = _fields(where, row, ROW_FIELDS)
    _text(f"{where}.task", row["task"])
    for key in ("text", "output_text"):
        if key in row:
            _text(f"{where}.{key}", row[key])
    _ids(f"{where}.prompt_ids", row["prompt_ids"], vocab, lo=1)
    if len(_ids(f"{where}.output_ids", row["output_ids"], vocab)) > max_new:
        raise ValueError(f"field {where}.output_ids: more than max_new_tokens ({max_new}) ids")
    return row


def from_bytes(data: bytes, source: str, *, vocab_size: int | None = None) -> dict[str, Any]:
    """``expected.json`` read by its schema (module docstring): exact JSON types (a bool or a
    float is no id), ``max_new_tokens`` in [1, ``MAX_TOKENS``], 1 to ``MAX_PROMPTS`` prompts,
    every id in ``[0, vocab_size)`` (the target tokenizer's ids: the ``vocab_limit`` it states
    too; None: the stated limit), no other field, no NaN, nesting bounded. ``ValueError`` naming ``source`` and the
    field otherwise."""
    from omnidraft_deploy.bundle.strict_json import parse_strict

    try:
        doc = _fields("", parse_strict(data.decode("utf-8"), max_depth=4), FIELDS)
        if doc["version"] != VERSION or type(doc["version"]) is not int:
            raise ValueError(f"version {doc['version']!r:.40}, this reader reads {VERSION}")
        max_new = _int("max_new_tokens", doc["max_new_tokens"], 1, MAX_TOKENS)
        vocab = vocab_size or MAX_IDS
        if "vocab_limit" in doc:
            lo, hi = (1, MAX_IDS) if vocab_size is None else (vocab_size, vocab_size)
            vocab = _int("vocab_limit", doc["vocab_limit"], lo, hi)
        if "eos_ids" in doc:
            _ids("eos_ids", doc["eos_ids"], vocab)
        rows = doc["prompts"]
        if type(rows) is not list or not 1 <= len(rows) <= MAX_PROMPTS:
            raise ValueError(f"field prompts: expected a list of 1 to {MAX_PROMPTS} prompts")
        for i, row in enumerate(rows):
            _row(f"prompts[{i}]", row, vocab, max_new)
    except UnicodeDecodeError as e:
        raise ValueError(f"{source}: not UTF-8 ({e.reason} at byte {e.start})") from None
    except ValueError as e:
        raise ValueError(f"{source}: not a valid expected-output file ({e})") from None
    return dict(doc)
