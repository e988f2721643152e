"""The one parser module (``cli.parser``): every verb wired to a handler, flag budgets held."""

from __future__ import annotations

import argparse

import pytest

from omnidraft_deploy.cli.main import HANDLERS, _cmd_export
from omnidraft_deploy.cli.parser import build_export_parser, build_parser


def _verbs(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    return [a.option_strings[-1] for a in parser._actions
            if a.option_strings and not isinstance(a, argparse._HelpAction)]  # fmt: skip


FLAG_BUDGET = {"run": 13, "export": 14}  # run: its 12 decoding flags and --no-server (bypass
# `omnidraft serve`); export: --target-from (a new drafter for a target exported once) and
# --drafter-from (a target exported again under another recipe, beside its verified drafter)


def test_every_verb_has_its_handler_and_at_most_12_flags() -> None:
    """12 flags of the verb's own (``FLAG_BUDGET`` names the exceptions); ``-v/--verbose``
    (every verb's, and the top level's) aside."""
    verbs = _verbs(build_parser(HANDLERS))
    assert set(verbs) == set(HANDLERS)
    for name, p in verbs.items():
        assert p.get_default("handler") is HANDLERS[name], name
        own = [f for f in _flags(p) if f != "--verbose"]
        assert len(own) <= FLAG_BUDGET.get(name, 12), (name, own)
    assert _flags(build_export_parser(_cmd_export)) == ["--version", *_flags(verbs["export"])]


def test_a_missing_handler_is_loud() -> None:
    with pytest.raises(KeyError, match="run"):
        build_parser({k: v for k, v in HANDLERS.items() if k != "run"})


def test_export_and_run_flags_parse_to_the_documented_defaults() -> None:
    args = build_export_parser(_cmd_export).parse_args([])
    # --max-seq-len unset: the models' own context, capped by a KV budget (resolve.context)
    assert (args.backend, args.max_seq_len, args.draft_len, args.out) == ("xnnpack", None, 4, None)
    args = build_parser(HANDLERS).parse_args(["run", "b", "--mode", "exact", "-v"])
    assert (args.mode, args.temperature, args.top_p, args.verbose) == ("exact", 0.7, None, True)
    with pytest.raises(SystemExit):
        build_parser(HANDLERS).parse_args(["run", "b", "--prompt", "a\udcff"])  # not UTF-8
