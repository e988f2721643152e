"""Strict JSON for files from outside: bounded nesting, no duplicate keys, no NaN / infinity.

``depth`` measures bracket nesting outside strings in one pass, so a caller can refuse deeply
nested text before ``json.loads`` recurses into it; ``loads_strict`` refuses duplicate keys (one
text, one meaning); ``check_finite`` refuses NaN / infinity anywhere in a decoded value (JSON has
no such numbers; Python's reader accepts them, Java's does not).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

_TOKEN = re.compile(r'"(?:[^"\\]+|\\.)*"?|[\[\]{}]', re.DOTALL)  # a string, or a bracket


def depth(text: str, limit: int | None = None) -> int:
    """Deepest bracket nesting outside strings; with ``limit``, stops as soon as it is passed
    (and returns ``limit + 1``), so a deeply nested text costs ``limit`` brackets, not its length.
    """
    level = deepest = 0
    for match in _TOKEN.finditer(text):
        ch = match.group()[0]
        if ch in "[{":
            level += 1
            if level > deepest:
                deepest = level
                if limit is not None and deepest > limit:
                    return deepest
        elif ch in "]}":
            level -= 1
    return deepest


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("duplicate keys in one object")
    return out


def loads_strict(text: str) -> Any:
    """``json.loads`` that refuses duplicate keys (ValueError)."""
    return json.loads(text, object_pairs_hook=_no_duplicates)


def check_finite(where: str, value: object) -> None:
    """ValueError naming the path of the first NaN / infinity inside ``value``."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"field {where}: {value} is not a finite number")
    if isinstance(value, dict):
        for key, item in value.items():
            check_finite(f"{where}.{key}", item)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_finite(f"{where}[{i}]", item)


def parse_strict(text: str, *, max_depth: int) -> Any:
    """JSON from outside, every rule of the module docstring at once: ``ValueError`` for nesting
    deeper than ``max_depth`` (checked before parsing: no recursion), a duplicate key, or NaN /
    infinity anywhere (``1e999`` parses as infinity)."""
    if depth(text, max_depth) > max_depth:
        raise ValueError(f"nested deeper than {max_depth} levels")
    value = loads_strict(text)
    try:
        check_finite("", value)
    except ValueError as e:  # the path from the top: "field .eos_ids[0]" -> "field eos_ids[0]"
        raise ValueError(str(e).replace("field .", "field ", 1)) from None
    return value
