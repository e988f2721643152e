"""The shipped prompt set (math, code, chat, summarisation; unicode, digits, code, leading spaces)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources


@dataclass(frozen=True)
class Prompt:
    task: str
    text: str


def load_prompts(tasks: set[str] | None = None) -> list[Prompt]:
    raw = json.loads(
        resources.files("omnidraft_deploy").joinpath("data/prompts.json").read_text("utf-8")
    )
    prompts = [Prompt(p["task"], p["text"]) for p in raw]
    return [p for p in prompts if tasks is None or p.task in tasks]


def spread(prompts: list[Prompt], n: int | None) -> list[Prompt]:
    """``n`` of ``prompts`` spread over the list, in its order (every ``len // n``-th: for 4 of
    the shipped 12, one per task); all of them when ``n`` is None or not smaller."""
    if n is None or n >= len(prompts):
        return list(prompts)
    if n < 1:
        raise ValueError(f"{n} prompts: at least 1")
    return prompts[:: len(prompts) // n][:n]
