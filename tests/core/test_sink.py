"""The sinked model (``reference.sink``): one function in every call style, the sink's K/V at
slot 0 of the stateful cache, and the LpNormalization form of RMSNorm."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.reference.model import build_model
from omnidraft_deploy.reference.sink import SinkModel, format_sink, parse_sink

SPEC = dataclasses.replace(get_preset("tiny-qwen2-7b"), vocab_size=384)
IDS = torch.tensor([[3, 9, 27, 81, 5, 6, 40]])


def _model():  # type: ignore[no-untyped-def]
    return build_model(SPEC, seed=5, max_seq_len=32).requires_grad_(False)


@pytest.mark.parametrize("tokens", [(7,), (7, 11)])
def test_every_call_style_is_the_model_after_the_sink_tokens(tokens: tuple[int, ...]) -> None:
    from omnidraft_deploy.exporters.exportable import empty_caches

    model = _model()
    sink = SinkModel(model, tokens)
    n = len(tokens)
    ref = model.forward_train(torch.cat([torch.tensor([tokens]), IDS], 1))[:, n:]
    torch.testing.assert_close(sink.forward_train(IDS), ref)
    caches = empty_caches(model)  # host caches: max_seq_len slots, the sink is not among them
    first = sink.forward_explicit(IDS[:, :4], torch.arange(4), *caches)
    for cache, entries in zip(caches, first[1:], strict=True):
        cache[:, :, :4] = entries  # the host writes the chunk at its positions
    second = sink.forward_explicit(IDS[:, 4:], torch.arange(4, 7), *caches)
    torch.testing.assert_close(torch.cat([first[0], second[0]], 1), ref, atol=1e-5, rtol=0)
    stateful = torch.cat(
        [sink(IDS[:, :4], torch.arange(4)), sink(IDS[:, 4:], torch.arange(4, 7))], 1
    )
    torch.testing.assert_close(stateful, ref, atol=1e-5, rtol=0)
    sink.reset_cache()  # the sink survives a reset
    torch.testing.assert_close(sink(IDS, torch.arange(7)), ref, atol=1e-5, rtol=0)


def test_lp_norm_form_is_rmsnorm_up_to_eps() -> None:
    model = _model()
    with torch.no_grad():  # hidden states of real size, where eps is negligible
        model.model.embed_tokens.weight.mul_(50.0)
    plain, lp = SinkModel(model, 7), SinkModel(model, 7, lp_norm=True)
    a, b = plain.forward_train(IDS), lp.forward_train(IDS)
    assert float((a - b).abs().max()) < 1e-3 * float(a.abs().max())


def test_sink_metadata_round_trips_and_rejects_garbage() -> None:
    assert parse_sink(format_sink((151643, 271))) == (151643, 271)
    assert parse_sink("2") == (2,)  # graphs written with one sink token
    with pytest.raises(ValueError, match="not comma-separated token ids"):
        parse_sink("2;271")
    with pytest.raises(ValueError, match="negative"):
        parse_sink("2,-1")


@pytest.mark.parametrize(("peaks", "keeps"), [({271: 60.0, 198: 40.0}, 198), ({271: 60.0}, None)])
def test_choose_sink_keeps_a_second_token_only_where_it_halves_the_peak(
    monkeypatch: pytest.MonkeyPatch, peaks: dict[int, float], keeps: int | None
) -> None:
    from omnidraft_deploy.reference import sink as sink_mod

    model = _model()
    first = sink_mod.sink_for(model, SPEC.tokenizer)

    def peak(m: SinkModel, ids: list[int]) -> float:  # scripted: 100 after the sink alone
        return 100.0 if m.tokens == (first,) else peaks.get(m.tokens[1], 90.0)

    monkeypatch.setattr(sink_mod, "first_token_peak", peak)
    chosen, measured = sink_mod.choose_sink(model, SPEC.tokenizer, [[3, 9, 27]])
    assert chosen == ((first,) if keeps is None else (first, keeps))
    assert measured["one"] == 100.0 and measured[repr("\n")] == peaks.get(198, 90.0)


@pytest.mark.parametrize("seed", range(5))
def test_choose_sink_stopping_early_chooses_what_reading_everything_would(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    from omnidraft_deploy.reference import sink as sink_mod

    model = _model()
    first = sink_mod.sink_for(model, SPEC.tokenizer)
    tokens = list(range(3, 40))
    gen = torch.Generator().manual_seed(seed)
    table = torch.rand(6, 64, generator=gen) * 100  # row 0: the sink alone; 1..: candidates
    rows = {(first,): 0} | {(first, t): k for k, t in enumerate((271, 198, 13, 220), 1)}
    calls = []

    def peak(m: SinkModel, ids: list[int]) -> float:
        calls.append(1)
        return float(table[rows[m.tokens], ids[0]])

    monkeypatch.setattr(sink_mod, "first_token_peak", peak)
    chosen, _ = sink_mod.choose_sink(model, SPEC.tokenizer, [tokens])
    exhaustive = {sink: float(table[r, tokens].max()) for sink, r in rows.items()}
    best = min(exhaustive, key=exhaustive.__getitem__)
    gain = exhaustive[best] * sink_mod.SECOND_SINK_GAIN <= exhaustive[(first,)]
    assert chosen == (best if gain else (first,))
    assert len(calls) < 5 * len(tokens)  # losers stop early
