"""Offline training text for the tiny drafter / targets: four tasks, all obtainable without network.

- ``math``: generated grade-school word problems with worked answers (seeded generator, GSM8K-like
  format ``Question: ... Answer: ... #### n``).
- ``code``: the Python standard library's own ``.py`` files (sorted paths; test suites excluded),
  cut into chunks at top-level blank lines.
- ``instruction``: ``User: What does `mod.func` do? Assistant: <docstring summary>`` pairs built
  from stdlib docstrings (parsed with ``ast``, nothing is imported).
- ``summarisation``: ``Summarize ... Text: <long docstring> Summary: <first sentence>`` built from
  stdlib module docstrings (and installed packages' ``METADATA`` text with ``package_docs``).

Every document is assigned to train or held-out by a hash of its text (stable across runs), and
``corpus_hash`` fingerprints the exact texts so caches keyed by it change when the data does
(e.g. another Python version's stdlib). Tokenizers are not used here.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import os
import random
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

TASKS = ("math", "code", "instruction", "summarisation")
_ITEMS = ["apples", "pencils", "stickers", "cookies", "books", "marbles", "cards", "shells"]
_NAMES = ["Natalia", "Omar", "Li", "Priya", "Sam", "Elena", "Kofi", "Mia", "Jonas", "Aiko"]


@dataclass(frozen=True)
class DataConfig:
    n_math: int = 3000  # generated problems
    max_code_files: int = 150  # stdlib files scanned for code chunks
    max_chars: int = 1500  # chunk / document length cap (characters)
    heldout_frac: float = 0.1
    seed: int = 0
    # installed packages' METADATA prose in `summarisation`: it varies with the environment (pip's
    # version, a stale egg-info in the working folder, this project's README), so a fresh clone's
    # corpus hash and the pretraining cache key would differ; off: the corpus is the stdlib's only
    package_docs: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.heldout_frac < 1:
            raise ValueError(f"heldout_frac must be in (0, 1), got {self.heldout_frac}")


def _math_problem(rng: random.Random) -> str:
    name, other = rng.sample(_NAMES, 2)
    item = rng.choice(_ITEMS)
    a, b, c = rng.randint(2, 60), rng.randint(2, 30), rng.randint(2, 9)
    kind = rng.randrange(4)
    if kind == 0:
        q = (
            f"{name} has {a} {item}. {other} gives {name} {b} more {item}. How many {item} "
            f"does {name} have now?"
        )
        steps, ans = f"{name} has {a} + {b} = {a + b} {item}.", a + b
    elif kind == 1:
        q = (
            f"{name} buys {c} boxes of {item} with {b} {item} in each box. How many {item} "
            f"does {name} buy in total?"
        )
        steps, ans = f"{c} boxes x {b} {item} = {c * b} {item}.", c * b
    elif kind == 2:
        total = a + b
        q = f"{name} had {total} {item} and gave {b} of them to {other}. How many are left?"
        steps, ans = f"{total} - {b} = {a} {item} are left.", a
    else:
        q = (
            f"{name} sold {a} {item} in April, and then sold {c} times as many in May. How "
            f"many {item} did {name} sell in April and May?"
        )
        steps = f"In May {name} sold {a} x {c} = {a * c}. Altogether {a} + {a * c} = {a + a * c}."
        ans = a + a * c
    return f"Question: {q}\nAnswer: {steps}\n#### {ans}\n"


def math_problems(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [_math_problem(rng) for _ in range(n)]


def _stdlib_files(limit: int) -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {
        "test",
        "tests",
        "idlelib",
        "lib2to3",
        "site-packages",
        "ensurepip",
        "turtledemo",
        "__pycache__",
    }
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip)
        files += [Path(dirpath) / f for f in filenames if f.endswith(".py")]
    return sorted(files)[:limit]


def _chunks(source: str, max_chars: int) -> list[str]:
    out, cur = [], ""
    for block in re.split(r"\n(?=\S)", source):
        if cur and len(cur) + len(block) > max_chars:
            out.append(cur)
            cur = ""
        cur += block[:max_chars] + "\n"
    if cur.strip():
        out.append(cur)
    return out


def _docstrings(path: Path, source: str) -> list[tuple[str, str, bool]]:
    """(qualified name, docstring, is_module) for the module and its top-level defs/classes."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    mod = path.stem
    out = []
    doc = ast.get_docstring(tree)
    if doc:
        out.append((mod, doc, True))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and not node.name.startswith("_"):
            doc = ast.get_docstring(node)
            if doc and len(doc) > 40:
                out.append((f"{mod}.{node.name}", doc, False))
    return out


def _first_sentence(text: str) -> str:
    para = " ".join(text.strip().split("\n\n")[0].split())
    m = re.match(r"(.+?[.!?])(\s|$)", para)
    return m.group(1) if m else para


def _is_prose(paragraph: str) -> bool:
    """Plain sentences only: no markup, tables, links, code or headings."""
    p = paragraph.strip()
    return (
        len(p) > 80
        and p[0].isalpha()
        and not any(c in p for c in "<>|`[]{}#=*")
        and p.count(".") >= 1
    )


def _package_texts(max_chars: int) -> list[str]:
    texts = []
    for dist in sorted(importlib.metadata.distributions(), key=lambda d: d.metadata["Name"] or ""):
        body = dist.metadata.get_payload() or ""  # type: ignore[attr-defined]
        prose = "\n\n".join(p for p in str(body).split("\n\n") if _is_prose(p))
        if len(prose) > 400:
            texts.append(prose[:max_chars])
    return texts


def build_corpus(cfg: DataConfig = DataConfig()) -> dict[str, list[str]]:
    """All documents by task (train and held-out together; see ``split``)."""
    corpus: dict[str, list[str]] = {t: [] for t in TASKS}
    corpus["math"] = math_problems(cfg.n_math, cfg.seed)
    for path in _stdlib_files(cfg.max_code_files):
        source = path.read_text("utf-8", errors="replace")
        corpus["code"] += _chunks(source, cfg.max_chars)
        for name, doc, _ in _docstrings(path, source):
            summary = _first_sentence(doc)
            corpus["instruction"].append(
                f"User: What does `{name}` do in Python?\nAssistant: {summary}\n"
            )
            if len(doc) > 300:
                corpus["summarisation"].append(_summary_doc(doc[: cfg.max_chars], summary))
    for text in _package_texts(cfg.max_chars) if cfg.package_docs else []:
        corpus["summarisation"].append(_summary_doc(text, _first_sentence(text)))
    return corpus


def _summary_doc(text: str, summary: str) -> str:
    return (
        f"Summarize the following text in one sentence.\nText: {text.strip()}\nSummary: {summary}\n"
    )


def is_heldout(text: str, frac: float) -> bool:
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "little") / 2**32 < frac


def split(
    corpus: dict[str, list[str]], frac: float
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(train, held-out) by text hash."""
    train = {t: [d for d in docs if not is_heldout(d, frac)] for t, docs in corpus.items()}
    held = {t: [d for d in docs if is_heldout(d, frac)] for t, docs in corpus.items()}
    return train, held


def corpus_hash(corpus: dict[str, list[str]]) -> str:
    h = hashlib.sha256()
    for task in sorted(corpus):
        for doc in corpus[task]:
            h.update(task.encode() + b"\0" + doc.encode("utf-8", errors="replace") + b"\0")
    return h.hexdigest()
