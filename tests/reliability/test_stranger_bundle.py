"""Issue 47, "a bundle from a stranger": one property per finding, each over a family of inputs
shaped after the finding (hypothesis draws the member), on the fuzz suite's seed bundle
(``bundle_mutations.make_seed``: real tables, tokenizers, graph metadata, reference output).

Each of these failed before the fix: ``run`` trusted a hash record over the manifest's size
claim; an unlisted ``special_tokens.json`` switched the map-against-tokenizer check off; the
quantization label was never held against the graph; ``--force`` replaced a user's file that a
copied manifest named; a chat template ran unbounded (or raised ``OverflowError``); crafted
``special_tokens.json`` / ``expected.json`` / ``tokenizer.json`` values escaped as internal
errors or were coerced (``[1.7, true]`` -> ``[1, 1]``).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bundle_mutations import (
    LISTED,
    MAP_SIZES,
    accepted_is_valid,
    make_seed,
    relist,
    tokenizer_json,
    write_manifest,
)
from conftest import LONG, record, scale
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mutations import EXPECTED_PATHS, RAW_VALUES, SPECIAL_PATHS, json_edit
from omnidraft_deploy.runtime.bundle import check_bundle

from omnidraft_deploy.bundle.manifest import BundleError

SETTINGS = settings(max_examples=25, deadline=None, database=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))  # fmt: skip


class Seed:
    """A seed bundle aged past the hash record's racy window, its pristine bytes, and a state
    folder holding the record of its files: each example edits it, then ``restore`` undoes."""

    def __init__(self, base: Path) -> None:
        from omnidraft_deploy.bundle.folder import verify_bundle
        from omnidraft_deploy.bundle.hash_record import RECORD_FILE

        self.root = make_seed(base / "b")
        self.files = {p: p.read_bytes() for p in self.root.rglob("*") if p.is_file()}
        old = time.time() - 3600
        for p in self.root.rglob("*"):
            os.utime(p, (old, old))
        self.state = base / "state"
        self.state.mkdir()
        verify_bundle(self.root, state=self.state)
        self.record = (self.state / RECORD_FILE).read_bytes()
        self.record_file = RECORD_FILE

    def doc(self) -> dict[str, Any]:
        return json.loads((self.root / "manifest.json").read_text())

    def restore(self) -> None:
        for p, data in self.files.items():
            if p.read_bytes() != data:
                p.write_bytes(data)
        (self.state / self.record_file).write_bytes(self.record)

    def refusal(self, **kwargs: Any) -> BundleError | None:
        try:
            check_bundle(self.root, **kwargs)
        except BundleError as e:
            return e
        return None


@pytest.fixture(scope="module")
def seed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seed]:
    s = Seed(tmp_path_factory.mktemp("stranger"))
    yield s


# --- run trusted the hash record over the manifest's size claim --------------------------------
@SETTINGS
@given(rel=st.sampled_from(LISTED), delta=st.integers(-(10**6), 10**6).filter(bool))
def test_a_hash_record_never_vouches_for_a_size_the_manifest_misstates(
    seed: Seed, rel: str, delta: int
) -> None:
    doc = seed.doc()
    size = doc["files"][rel]["size"]
    doc["files"][rel]["size"] = max(0, size + delta) if size + delta != size else size + 1
    if doc["files"][rel]["size"] == size:
        doc["files"][rel]["size"] = size + 1
    write_manifest(seed.root, doc)
    try:
        validate = seed.refusal(trust_record=False)
        run = seed.refusal(state=seed.state)  # the record of the unchanged files is there
        assert validate is not None and run is not None, (validate, run)
        assert str(run) == str(validate) and rel in str(run) and "in manifest" in run.problem
    finally:
        seed.restore()


# --- an unlisted special_tokens.json switched the map-against-tokenizer check off -------------
@SETTINGS
@given(role=st.sampled_from(["drafter", "target"]), extra=st.sampled_from([-1, 1, 2, 1000]),
       unlist=st.booleans())  # fmt: skip
def test_the_map_is_held_against_the_tokenizer_whatever_files_are_listed(
    seed: Seed, role: str, extra: int, unlist: bool
) -> None:
    n = MAP_SIZES[role]
    if n + extra < 1:
        extra = 1
    doc = seed.doc()
    rel = f"{role}_tokenizer/tokenizer.json"
    (seed.root / rel).write_bytes(tokenizer_json(n + extra))
    relist(seed.root, doc, rel)
    if unlist:
        del doc["files"][f"{role}_tokenizer/special_tokens.json"]
    write_manifest(seed.root, doc)
    try:
        refused = seed.refusal()
        assert refused is not None, f"a {n}-id map opened beside a {n + extra}-id {role} tokenizer"
        where = "vocab_map.bin" if unlist else "special_tokens.json"
        assert where in refused.path and str(n + extra) in refused.problem, refused
    finally:
        seed.restore()


def test_a_bundle_without_special_tokens_still_opens_when_its_map_fits(seed: Seed) -> None:
    """The control: unlisting ``special_tokens.json`` alone changes nothing the map can see."""
    doc = seed.doc()
    for role in ("drafter", "target"):
        del doc["files"][f"{role}_tokenizer/special_tokens.json"]
    write_manifest(seed.root, doc)
    try:
        assert seed.refusal() is None
    finally:
        seed.restore()


# --- the quantization label was not checked against the graph ---------------------------------
@SETTINGS
@given(role=st.sampled_from(["drafter", "target"]), data=st.data())
def test_a_quantization_label_the_graph_contradicts_is_refused(
    seed: Seed, role: str, data: st.DataObject
) -> None:
    from omnidraft_deploy.catalog.backends import recipe_names

    label = data.draw(st.sampled_from([n for n in recipe_names("onnx") if n != "fp32"]))
    doc = seed.doc()
    doc["graphs"][role]["quantization"] = label
    write_manifest(seed.root, doc)
    try:
        refused = seed.refusal()
        assert refused is not None, f"{role} labelled {label} over an fp32 graph opened"
        assert refused.path.endswith(f"{role}.onnx") and "quantization" in refused.problem
    finally:
        seed.restore()


# --- crafted values in the files a bundle carries ---------------------------------------------
ISSUE_SPECIALS = ['{"name": "x", "bos_id": null, "eos_ids": [1e999], "vocab_size": 3}',
                  '{"name": "x", "bos_id": null, "eos_ids": [1.7, true], "vocab_size": 3}',
                  '{"name": "x", "bos_id": "x", "eos_ids": [], "vocab_size": 3}',
                  "[" * 100_000 + "]" * 100_000]  # fmt: skip


def _relisted(seed: Seed, rel: str, data: bytes) -> BundleError | None:
    """Open the seed with ``rel`` replaced by ``data`` (and relisted); an accepted bundle must
    pass the independent oracle (``bundle_mutations.accepted_is_valid``)."""
    doc = seed.doc()
    (seed.root / rel).write_bytes(data)
    relist(seed.root, doc, rel)
    write_manifest(seed.root, doc)
    try:
        refused = seed.refusal()
        if refused is None:
            accepted_is_valid(seed.root, doc)
        return refused
    finally:
        seed.restore()


@pytest.mark.parametrize("text", ISSUE_SPECIALS, ids=["1e999", "float-bool", "bos-str", "deep"])
def test_the_issues_special_tokens_are_refused_naming_the_file(seed: Seed, text: str) -> None:
    refused = _relisted(seed, "target_tokenizer/special_tokens.json", text.encode())
    assert refused is not None and refused.path.endswith("special_tokens.json"), refused


@SETTINGS
@given(role=st.sampled_from(["drafter", "target"]), seed_n=st.integers(0, 2**32))
def test_crafted_special_tokens_are_refused_or_exact(seed: Seed, role: str, seed_n: int) -> None:
    """Any field set to any raw crafted value (``mutations.RAW_VALUES``), deleted, duplicated or
    cut: a ``BundleError`` naming the file, or a file whose every value has its exact type."""
    from mutations import RandomPick

    rel = f"{role}_tokenizer/special_tokens.json"
    text = (seed.root / rel).read_text()
    try:
        text = json_edit(text, RandomPick(seed_n), SPECIAL_PATHS)
    except (KeyError, IndexError, TypeError):
        return
    refused = _relisted(seed, rel, text.encode())  # accepted: exact types (the oracle)
    assert refused is None or refused.path.endswith("special_tokens.json"), refused


@SETTINGS
@given(path=st.sampled_from(EXPECTED_PATHS), raw=st.sampled_from(RAW_VALUES))
def test_crafted_expected_values_are_refused_by_every_opener(
    seed: Seed, path: tuple[Any, ...], raw: str
) -> None:
    """``expected.json`` with ``"max_new_tokens": 1e999`` (and its kin) is refused by the opener
    that ``run`` and ``validate`` share, naming the file: never an internal error."""
    doc = json.loads((seed.root / "expected.json").read_text())
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = "__RAW__"
    text = json.dumps(doc).replace('"__RAW__"', raw)
    refused = _relisted(seed, "expected.json", text.encode())  # accepted: the oracle held
    assert refused is None or refused.path.endswith("expected.json"), refused


@SETTINGS
@given(role=st.sampled_from(["drafter", "target"]), at=st.floats(0, 1), op=st.integers(0, 3))
def test_a_corrupt_tokenizer_file_is_refused_naming_it(
    seed: Seed, role: str, at: float, op: int
) -> None:
    rel = f"{role}_tokenizer/tokenizer.json"
    data = (seed.root / rel).read_bytes()
    i = int(at * (len(data) - 1))
    edits = [data[:i], data[:i] + b"\x00" + data[i + 1 :], data.replace(b"WordLevel", b"Word"),
             b'{"model": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"]  # fmt: skip
    refused = _relisted(seed, rel, edits[op])
    if refused is not None:
        assert refused.path.endswith(rel) or "vocab_map.bin" in refused.path, refused


# --- --force replaced a user's file that a copied manifest lists by name -----------------------
@SETTINGS
@given(rel=st.sampled_from(LISTED), mine=st.binary(min_size=0, max_size=64))
def test_force_keeps_a_users_file_a_copied_manifest_names(
    seed: Seed, tmp_path_factory: pytest.TempPathFactory, rel: str, mine: bytes
) -> None:
    from omnidraft_deploy.resolve.out_dir import InputError, check_out_dir

    out = tmp_path_factory.mktemp("force")
    shutil.copyfile(seed.root / "manifest.json", out / "manifest.json")
    (out / rel).parent.mkdir(parents=True, exist_ok=True)
    (out / rel).write_bytes(mine)
    if mine == (seed.root / rel).read_bytes():
        assert check_out_dir(out, force=True) is True  # provably the bundle's: replaceable
        return
    with pytest.raises(InputError, match="--out") as e:
        check_out_dir(out, force=True)
    named = rel if "/" not in rel else rel.split("/")[0] + "/"  # a folder of no bundle file
    assert named in str(e.value) and (out / rel).read_bytes() == mine


def test_the_issues_force_export_keeps_expected_json(
    seed: Seed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``mkdir F; cp <bundle>/manifest.json F/; echo mine > F/expected.json; omnidraft-export
    ... --out F --force`` exited 0 and F/expected.json was gone."""
    from omnidraft_deploy.cli.main import export_main

    out = tmp_path / "F"
    out.mkdir()
    shutil.copyfile(seed.root / "manifest.json", out / "manifest.json")
    (out / "expected.json").write_text("mine\n")
    args = ["--target", "tiny-qwen2-7b", "--drafter", "tiny-llama-68m", "--backend", "onnx",
            "--out", str(out), "--force"]  # fmt: skip
    assert export_main(args) == 2
    assert "expected.json" in capsys.readouterr().err
    assert (out / "expected.json").read_text() == "mine\n"


def test_a_file_saved_into_out_while_the_export_ran_is_kept(seed: Seed, tmp_path: Path) -> None:
    """The last look before the swap (``replace.refuse_foreign``): a file the user saved into
    the old bundle's folder during the export keeps the old folder, and nothing is published."""
    from omnidraft_deploy.bundle.folder import atomic_bundle_dir

    final = tmp_path / "bundle"
    shutil.copytree(seed.root, final)
    with pytest.raises(BundleError, match="notes.txt"), atomic_bundle_dir(final) as tmp:
        shutil.copytree(seed.root, tmp, dirs_exist_ok=True)
        (final / "notes.txt").write_text("saved meanwhile")
    assert (final / "notes.txt").read_text() == "saved meanwhile"
    assert (final / "manifest.json").read_bytes() == (seed.root / "manifest.json").read_bytes()


# --- the chat template ran with no time bound -------------------------------------------------
@st.composite
def hostile_templates(draw: st.DrawFn) -> str:
    """Nested loops (the issue's ``range(100000)`` pair among them), huge ranges
    (``range(10**9)``), output and memory bombs, deep nesting, syntax errors, recursion."""
    kind = draw(st.sampled_from(["loops", "range", "bomb", "deep", "syntax", "macro"]))
    if kind == "loops":
        n = draw(st.sampled_from([10, 1000, 100_000]))
        body = draw(st.sampled_from(["", "x", "{{ i }}", "{{ 'x' * 1000 }}"]))
        if draw(st.booleans()):  # two loops deep
            body = f"{{% for j in range({n}) %}}{body}{{% endfor %}}"
        return f"{{% for i in range({n}) %}}{body}{{% endfor %}}{{{{ messages[0].content }}}}"
    if kind == "range":
        return f"{{{{ range({draw(st.sampled_from(['10**9', '2**63', '-1', '10**100']))})|list }}}}"
    if kind == "bomb":
        return ("{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}"
                "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}")  # fmt: skip
    if kind == "deep":
        n = draw(st.sampled_from([100, 5000]))
        return "{{ " + "(" * n + "1" + ")" * n + " }}"
    if kind == "syntax":
        return draw(
            st.sampled_from(["{% for %}", "{{", "{% if %}{% endfor %}", "{{ a.__class__ }}"])
        )
    return "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"


def _render_within(template: str, seconds: float) -> tuple[str | None, BaseException | None]:
    """``render_chat`` in a thread, so a render that never ends fails the test instead of
    hanging it (as the template did before)."""
    from omnidraft_deploy.vocab.bundle_tokenizer import render_chat

    out: list[Any] = [None, None]

    def go() -> None:
        try:
            out[0] = render_chat(template, "hi", source="b/chat_template.jinja")
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            out[1] = e

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"render_chat still running after {seconds} s: {template[:80]}"
    return out[0], out[1]


TEMPLATES = scale(12, 300)  # hostile templates per run (long mode: OMNIDRAFT_RELIABILITY=long)


@settings(max_examples=TEMPLATES, deadline=None, database=None, derandomize=not LONG,
          suppress_health_check=list(HealthCheck))  # fmt: skip
@given(template=hostile_templates())
def test_a_chat_template_renders_within_limits_or_fails_naming_itself(
    monkeypatch: pytest.MonkeyPatch, template: str
) -> None:
    from omnidraft_deploy.vocab import chat_sandbox

    with monkeypatch.context() as mp:
        mp.setattr(chat_sandbox, "TIMEOUT_S", 1.0)
        text, error = _render_within(template, 20.0)
    if error is None:
        assert text is not None and len(text.encode()) <= chat_sandbox.output_limit(["hi"])
    else:
        assert isinstance(error, ValueError) and "b/chat_template.jinja" in str(error), error
    record("chat template (vocab/chat_sandbox.py)", part="long" if LONG else "quick", inputs=1,
           accepted=int(error is None), rejected=int(error is not None), crashes=0,
           invalid_accepted=0)  # fmt: skip


@pytest.mark.parametrize("template", [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{{ range(10**9)|list }}"], ids=["nested-100000", "range-1e9"])  # fmt: skip
def test_the_issues_chat_templates_fail_naming_the_template(
    monkeypatch: pytest.MonkeyPatch, template: str
) -> None:
    """The issue's two: still running at 90 s, and an ``OverflowError`` out of ``render_chat``."""
    from omnidraft_deploy.vocab import chat_sandbox

    monkeypatch.setattr(chat_sandbox, "TIMEOUT_S", 1.0)
    text, error = _render_within(template, 20.0)
    assert isinstance(error, chat_sandbox.ChatTemplateError), (text, error)
    assert str(error).startswith("b/chat_template.jinja: the chat template does not render")
