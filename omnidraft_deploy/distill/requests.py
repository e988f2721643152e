"""What ``omnidraft distill`` asks the target: the user's own requests, or the shipped request sets.

- ``user_requests(path)``: a plain text file (one request a line, blank lines skipped), a
  ``.jsonl`` file (one ``{"text": ..., "task": ...}`` object a line, for requests of several
  lines; ``task`` optional) or a folder (every regular file in it, by name, is one request).
  Errors name the file and line.
- ``shipped_requests(per_task, seed)``: requests in five shapes (``TASKS``: math, code, chat,
  summarisation, code edits) built from the offline corpus's *training* split (``distill.data``:
  generated word problems, the Python standard library's own functions and docstrings, under the
  PSF licence that ships with every Python) and a seeded list of everyday topics. A request whose
  text is one of the shipped or benchmark prompts (``exclude``) is never asked.

Tokenizers are not used here; the caller renders each text with the target's chat template.
"""

from __future__ import annotations

import ast
import json
import random
import re
import sysconfig
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

MAX_REQUEST_BYTES = 1 << 20  # one request: a file of a folder, or a line


@dataclass(frozen=True)
class Request:
    task: str  # a shipped shape (``TASKS``), or ``user``
    text: str


TASKS = ("math", "code", "chat", "summarisation", "code_edit")
EDITS = (
    "Add type hints and a docstring to this function, and keep its behaviour:",
    "Rewrite this function to be easier to read, without changing what it does:",
    "Explain what this function does, then suggest one improvement:",
    "Find a possible bug in this function and show the fixed version:",
)
CHATS = (
    "What does `{name}` do in Python?",
    "Can you explain `{name}` in simple terms?",
    "When would I use `{name}` in a Python program? Give a short example.",
)
# everyday requests: template x topic (seeded); none is a benchmark prompt (checked by the caller)
EVERYDAY = (
    "Give me three tips for {t}.",
    "What are the pros and cons of {t}?",
    "How should a beginner get started with {t}?",
    "Write a short, polite email to a neighbour about {t}.",
    "Explain {t} to a ten-year-old.",
    "What are common mistakes people make with {t}?",
)
TOPICS = (
    "growing tomatoes on a balcony",
    "learning to play the guitar",
    "saving money on groceries",
    "running a first 5 km race",
    "keeping a houseplant alive",
    "planning a weekend trip by train",
    "writing a cover letter",
    "baking sourdough bread",
    "learning a second language",
    "sleeping better",
    "public speaking",
    "cycling to work",
    "keeping a reading habit",
    "organising a small birthday party",
    "choosing a laptop for university",
    "composting at home",
    "taking better phone photos",
    "making a monthly budget",
    "teaching a dog to sit",
    "preparing for a job interview",
    "reducing screen time",
    "starting to meditate",
    "cooking rice without a rice cooker",
    "volunteering locally",
)


def _functions(source: str, max_lines: int) -> list[ast.FunctionDef]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
            and n.end_lineno is not None and 4 <= n.end_lineno - n.lineno < max_lines]  # fmt: skip


def _without_docstring(source: str, fn: ast.FunctionDef) -> str:
    lines = source.splitlines()[fn.lineno - 1 : fn.end_lineno]
    text = "\n".join(lines)
    first = text.splitlines()[0]
    indent = len(first) - len(first.lstrip())
    text = "\n".join(line[indent:] for line in text.splitlines())
    return re.sub(r'\n\s*(""".*?"""|\'\'\'.*?\'\'\')', "", text, count=1, flags=re.S)


def _signature_prompt(source: str, fn: ast.FunctionDef) -> str | None:
    doc = ast.get_docstring(fn)
    if not doc or len(doc) < 30 or fn.name.startswith("_"):
        return None
    header = source.splitlines()[fn.lineno - 1].strip()
    if not header.endswith(":"):
        return None
    summary = " ".join(doc.strip().split("\n\n")[0].split())
    return f'{header}\n    """{summary}"""\n'


def _lower_first(summary: str) -> str:
    """'Return the data ...' -> 'returns the data ...' (a request: 'Write a function that ...')."""
    word, _, rest = summary.partition(" ")
    verb = word.lower()
    verb = (
        verb
        if verb.endswith("s") or not verb.isalpha()
        else verb + ("es" if verb.endswith(("sh", "ch", "x")) else "s")
    )
    return f"{verb} {rest}".rstrip()


def request_texts(docs: dict[str, list[str]], sources: Sequence[str], per_task: int,
                  seed: int) -> list[tuple[str, str]]:  # fmt: skip
    """``per_task`` (task, user text) requests per task of ``TASKS``, seeded.

    ``docs``: the corpus *training* split (``distill.data.split``); ``sources``: Python source
    files' texts (functions for the code and code-edit requests).
    """
    rng = random.Random(seed)
    fns = [(s, f) for s in sources for f in _functions(s, 30)]
    rng.shuffle(fns)
    sigs = [p for s, f in fns if (p := _signature_prompt(s, f))]
    asks = [f"Write a Python function that {_lower_first(p.split(chr(34) * 3)[1])}" for p in sigs]
    edits = [_without_docstring(s, f) for s, f in fns if len(_without_docstring(s, f)) < 1200]
    names = [m.group(1) for d in docs.get("instruction", []) if (m := re.search(r"`([^`]+)`", d))]
    maths = [
        d[: d.index("Answer:") + len("Answer:")] for d in docs.get("math", []) if "Answer:" in d
    ]
    summaries = [d[: d.index("Summary:") + len("Summary:")]
                 for d in docs.get("summarisation", []) if "Summary:" in d]  # fmt: skip
    pools: dict[str, list[str]] = {
        "math": maths,
        "code": sigs[: len(sigs) // 2] + asks[len(sigs) // 2 :],
        "chat": [f"User: {rng.choice(CHATS).format(name=n)}\nAssistant:" for n in names[:200]]
        + [f"User: {e.format(t=t)}\nAssistant:" for e in EVERYDAY for t in TOPICS],
        "summarisation": summaries,
        "code_edit": [f"{rng.choice(EDITS)}\n\n```python\n{e}\n```" for e in edits],
    }
    out: list[tuple[str, str]] = []
    for task in TASKS:
        pool = list(dict.fromkeys(pools[task]))
        if len(pool) < per_task:
            raise ValueError(f"{task}: only {len(pool)} distinct requests, {per_task} wanted")
        out += [(task, t) for t in rng.sample(pool, per_task)]
    return out


def packaged_prompt_texts() -> set[str]:
    """Texts of the prompts shipped in the package (``run``'s and the benchmarks' real-pair set):
    never a distillation request."""
    texts: set[str] = set()
    for name in ("prompts.json", "real_pair_prompts.json"):
        raw = resources.files("omnidraft_deploy").joinpath(f"data/{name}").read_text("utf-8")
        texts |= {p["text"] for p in json.loads(raw)}
    return texts


def shipped_requests(per_task: int, seed: int = 0, exclude: Iterable[str] = ()) -> list[Request]:
    """``per_task`` requests of each shape of ``TASKS`` (module docstring), the tasks in turn, so
    that any prefix of the list covers every shape; the same list for the same arguments."""
    from omnidraft_deploy.distill.data import DataConfig, build_corpus, split

    cfg = DataConfig()
    train, _ = split(build_corpus(cfg), cfg.heldout_frac)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    sources = [p.read_text("utf-8", errors="replace") for p in sorted(stdlib.glob("*.py"))[:120]]
    banned = packaged_prompt_texts() | set(exclude)
    got = [r for r in request_texts(train, sources, per_task, seed) if r[1] not in banned]
    by_task = [[r for r in got if r[0] == t] for t in TASKS]
    return [Request(*r[i]) for i in range(per_task) for r in by_task if i < len(r)]


def _checked(path: Path, where: str, text: object) -> str:
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{path}{where}: no request text")
    if len(text.encode("utf-8")) > MAX_REQUEST_BYTES:
        raise ValueError(f"{path}{where}: a request over {MAX_REQUEST_BYTES} bytes")
    return text


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def user_requests(path: str | Path) -> list[Request]:
    """The requests of a prompt file or folder (module docstring), in order."""
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith("."))
        out = [Request("user", _checked(f, "", _read(f))) for f in files]
    elif p.suffix == ".jsonl":
        out = []
        for n, line in enumerate(_read(p).splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{p}:{n}: not a JSON object ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{p}:{n}: not a JSON object")
            task = row.get("task", "user")
            out.append(Request(task if isinstance(task, str) else "user",
                               _checked(p, f":{n}", row.get("text"))))  # fmt: skip
    else:
        out = [Request("user", _checked(p, f":{n}", line))
               for n, line in enumerate(_read(p).splitlines(), 1) if line.strip()]  # fmt: skip
    if not out:
        raise ValueError(f"{p}: no requests in it")
    return out


def requests_for(prompts: str | Path | None, n: int, seed: int = 0) -> list[Request]:
    """The first ``n`` requests of the prompt file or folder ``prompts``, else of the shipped
    sets (every shape in turn)."""
    if prompts:
        return user_requests(prompts)[:n]
    return shipped_requests(-(-n // len(TASKS)), seed)[:n]
