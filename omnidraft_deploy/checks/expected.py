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


def from_bytes(data: bytes, source: str) -> dict[str, Any]:
    """Parse and check ``expected.json``; ``ValueError`` naming ``source`` and the problem."""
    try:
        doc = json.loads(data.decode("utf-8"))
        if doc.get("version") != VERSION:
            raise ValueError(f"version {doc.get('version')!r}, this reader reads {VERSION}")
        for row in doc["prompts"]:
            if not all(isinstance(i, int) for i in row["prompt_ids"] + row["output_ids"]):
                raise ValueError("ids must be integers")
        int(doc["max_new_tokens"])
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise ValueError(f"{source}: not a valid expected-output file ({e})") from None
    return dict(doc)
