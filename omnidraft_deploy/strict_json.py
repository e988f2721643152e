"""Strict JSON for files from outside: bounded nesting, no duplicate keys, no NaN / infinity.

``depth`` measures bracket nesting outside strings in one pass, so a caller can refuse deeply
nested text before ``json.loads`` recurses into it; ``loads_strict`` refuses duplicate keys (one
text, one meaning); ``check_finite`` refuses NaN / infinity anywhere in a decoded value (JSON has
no such numbers; Python's reader accepts them, Java's does not).
"""

from __future__ import annotations

import json
import math
from typing import Any


def depth(text: str) -> int:
    """Deepest bracket nesting outside strings."""
    level = deepest = 0
    in_str = escaped = False
    for ch in text:
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            level += 1
            deepest = max(deepest, level)
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
