"""An attention-sink prefix for QNN graphs: the first token's massive activations stay out of them.

Real LLMs put *massive activations* on the first token of a sequence, whatever it is
(SmolLM2-135M: 22,000-25,500 in the residual stream at position 0 on every shipped prompt;
1,100 at most anywhere else), because that token is where attention sinks. A uint16 scale per
tensor over that range is what left the all-integer SmolLM2 graph with top-1 0.04. PrefixQuant
(Chen et al. 2024) moves such tokens into a fixed prefix whose KV cache is computed once in
float, so the quantised model never sees them. Here:

- ``SinkModel`` is the model conditioned on a fixed sink (the tokenizer's BOS, else its first
  EOS, and optionally a second token: ``choose_sink``) at positions ``0..S-1``: its K/V,
  computed in fp32 at export, are constants of the graph, concatenated in front of the
  host-held caches; the tokens the host feeds sit at positions ``S..``. The host contract
  (``graph_contract``) does not change: the host still writes this chunk's entries at
  ``input_pos`` and steps positions from 0; only the function is the sinked model's (what its
  ``forward`` / ``forward_train`` compute, the eager reference of parity).
- ``lp_norm=True`` writes each RMSNorm as ``LpNormalization(x) * sqrt(dim) * weight`` (the same
  function up to RMSNorm's eps, which real hidden states dwarf): one HTP op instead of the
  decomposed ``x^2 -> mean -> sqrt -> div``, whose uint16 ``x^2`` rounds ordinary tokens.

Measured in eager fake-quantisation (uint16 per-tensor inputs of every matmul and norm, ranges
from held-out text; 12 shipped prompts x 24 tokens, SmolLM2-135M, top-1 against fp32 over the
rows after the first): without the sink 0.047, with it 0.988 with 16-bit weights and the L2
norm; the HTP refuses 16-bit MatMul weights, and 8-bit per-channel weights keep 0.926 (GPTQ on
that grid: 0.961). The graph's metadata names the sink token (``SINK_KEY``), so verification
compares it with the sinked eager model.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any, cast

import torch
from torch import Tensor, nn

from omnidraft_deploy.reference.model import ModelArgs, RMSNorm, Transformer

log = logging.getLogger(__name__)
SINK_KEY = "omnidraft.sink_token"  # ONNX metadata: the sink token id of a sinked graph


def sink_token(tokenizer: str) -> int:
    """The tokenizer's BOS id, else its first EOS id (a token real text begins documents with);
    0 for a test tokenizer that is not a real one (logged)."""
    from omnidraft_deploy.catalog.assets import AssetError
    from omnidraft_deploy.vocab.tokenizers import load_tokenizer

    try:
        tok = load_tokenizer(tokenizer)
    except (KeyError, AssetError) as e:
        log.warning("sink token: tokenizer %r unavailable (%s); using id 0", tokenizer, e)
        return 0
    if tok.bos_id is not None:
        return tok.bos_id
    if not tok.eos_ids:
        raise ValueError(f"tokenizer {tokenizer!r} has neither BOS nor EOS: no sink token")
    return tok.eos_ids[0]


def sink_for(model: Transformer, tokenizer: str) -> int:
    """The sink token a QNN graph of ``model`` is conditioned on (ids of test presets, whose
    vocabulary is cut, read modulo its size)."""
    return sink_token(tokenizer) % model.args.vocab_size


# Second sink tokens tried (single tokens of the tokenizer), and by how much one must lower the
# first token's peak activation to be kept
SECOND_SINK_TEXTS = ("\n\n", "\n", ".", " ")
SECOND_SINK_GAIN = 2.0


@torch.no_grad()
def first_token_peak(model: SinkModel, token_ids: Sequence[int]) -> float:
    """Max |x| of the residual stream (every layer's input and the final norm's) at the first
    token after ``model``'s sink, ``token_ids`` read as a prompt."""
    seen: list[Tensor] = []
    inner = model.inner.model
    norms: list[Any] = [layer.input_layernorm for layer in inner.layers]  # type: ignore[union-attr]
    norms.append(inner.norm)
    at = model.n_sink
    hooks = [n.register_forward_pre_hook(lambda _m, x: seen.append(x[0][0, at].abs().max()))
             for n in norms]  # fmt: skip
    try:
        model.forward_train(torch.tensor([list(token_ids)]))
    finally:
        for h in hooks:
            h.remove()
    return float(torch.stack(seen).max())


def choose_sink(model: Transformer, tokenizer: str, prompts: Sequence[Sequence[int]],
                n_tokens: int = 512) -> tuple[tuple[int, ...], dict[str, float]]:  # fmt: skip
    """The sink a QNN graph of ``model`` is conditioned on: ``sink_for``'s token, and after it
    the ``SECOND_SINK_TEXTS`` token that lowers the peak activation of the first prompt token
    most, if by ``SECOND_SINK_GAIN`` or more (peaks over up to ``n_tokens`` distinct tokens of
    ``prompts``, each read as a prompt's first token). Also returns the peaks measured (a
    candidate that cannot beat the best so far stops being read, hardest tokens first, so its
    peak is a lower bound; the choice is the exhaustive one).

    Why: after Qwen2.5-0.5B's ``<|endoftext|>`` the prompt's first token grows massive
    activations of its own (max 534 over held-out tokens, against ~100 elsewhere), which the
    graph's uint16 ranges must then cover; a blank line after the sink takes them instead
    (``"\n\n"``: 97), inside the fp32 prefix. SmolLM2-135M (all 417 distinct tokens of its
    calibration text): 26,455 (p99 20,221) -> 894 with ``"."``; the 128 lowest ids alone read
    802 and would have kept one token.
    """
    first = sink_for(model, tokenizer)
    distinct = sorted({t for p in prompts for t in p})
    step = -(-len(distinct) // n_tokens) or 1  # spread over the ids, not the lowest ids
    distinct = distinct[::step]
    if not distinct:
        return (first,), {}

    alone = SinkModel(model, (first,))
    base = {t: first_token_peak(alone, [t]) for t in distinct}
    order = sorted(distinct, key=base.__getitem__, reverse=True)  # the hardest tokens first
    peaks = {"one": max(base.values())}
    best: tuple[tuple[int, ...], float] = ((first,), peaks["one"])
    for text, second in _single_tokens(tokenizer, SECOND_SINK_TEXTS, model.args.vocab_size):
        pair = SinkModel(model, (first, second))
        worst = 0.0
        for t in order:  # stops once the pair cannot beat the best: its peak is then a bound
            worst = max(worst, first_token_peak(pair, [t]))
            if worst >= best[1]:
                break
        peaks[repr(text)] = worst
        if worst < best[1]:
            best = ((first, second), worst)
    chosen = best[0] if best[1] * SECOND_SINK_GAIN <= peaks["one"] else (first,)
    log.info("sink %s: first-token peaks %s", chosen, {k: round(v) for k, v in peaks.items()})
    return chosen, peaks


def _single_tokens(tokenizer: str, texts: Sequence[str], vocab: int) -> list[tuple[str, int]]:
    """``(text, id)`` for each of ``texts`` the tokenizer encodes as one in-vocabulary token."""
    from omnidraft_deploy.catalog.assets import AssetError
    from omnidraft_deploy.vocab.tokenizers import load_tokenizer

    try:
        tok = load_tokenizer(tokenizer)
    except (KeyError, AssetError):
        return []
    found = [(text, tok.encode(text)) for text in texts]
    return [(text, ids[0]) for text, ids in found if len(ids) == 1 and ids[0] < vocab]


class LpRMSNorm(nn.Module):
    """RMSNorm as ``x / ||x||_2 * sqrt(dim) * weight``; ``export`` emits ONNX LpNormalization."""

    def __init__(self, norm: RMSNorm) -> None:
        super().__init__()
        self.weight, self.export = norm.weight, False
        self.root_dim = math.sqrt(norm.weight.shape[0])

    def forward(self, x: Tensor) -> Tensor:
        if self.export:
            unit = torch.onnx.ops.symbolic(
                "::LpNormalization", (x,), {"axis": -1, "p": 2}, dtype=x.dtype, shape=x.shape
            )
        else:
            unit = nn.functional.normalize(x.float(), dim=-1).to(x.dtype)
        return unit * (self.root_dim * self.weight)


def _swap_norms(module: nn.Module) -> None:
    for name, child in list(module.named_children()):
        if isinstance(child, RMSNorm):
            setattr(module, name, LpRMSNorm(child))
        else:
            _swap_norms(child)


class SinkModel(nn.Module):
    """``model`` conditioned on ``token`` at position 0, with ``model``'s own call styles.

    ``args`` are ``model``'s (``max_seq_len`` host slots); inside, a copy with one more slot
    holds the sink at slot 0. ``forward_explicit`` is the QNN graph's function (the sink's K/V
    are constants in front of the host caches); ``forward`` (stateful) and ``forward_train`` are
    the same function for the eager reference. ``lp_norm``: RMSNorms as ``LpRMSNorm`` (computed;
    ``set_export`` makes them the ONNX op for tracing)."""

    def __init__(self, model: Transformer, tokens: int | Sequence[int], *,
                 lp_norm: bool = False) -> None:  # fmt: skip
        super().__init__()
        a = model.args
        self.args: ModelArgs = a
        self.tokens = (tokens,) if isinstance(tokens, int) else tuple(tokens)
        n = self.n_sink = len(self.tokens)
        if not n:
            raise ValueError("a sink needs at least one token")
        inner = Transformer(ModelArgs(**{**vars(a), "max_seq_len": a.max_seq_len + n}))
        inner.load_state_dict(model.state_dict())
        self.inner = inner.eval().requires_grad_(False)
        with torch.no_grad():
            empty = [torch.zeros(1, a.n_kv_heads, a.max_seq_len + n, a.head_dim)] * (2 * a.n_layers)
            _, *kv = inner.forward_explicit(torch.tensor([self.tokens]), torch.arange(n), *empty)
        for i, t in enumerate(kv):
            self.register_buffer(f"sink_{i}", t.contiguous(), persistent=False)
        if lp_norm:
            _swap_norms(self.inner)
        self.reset_cache()

    def set_export(self, on: bool) -> None:
        """LpRMSNorms as the ONNX op (``on``: for tracing) or computed (eager, calibration)."""
        for m in self.modules():
            if isinstance(m, LpRMSNorm):
                m.export = on

    def sink_kv(self) -> list[Tensor]:
        return [getattr(self, f"sink_{i}") for i in range(2 * self.args.n_layers)]

    def forward_explicit(self, token_ids: Tensor, input_pos: Tensor, *caches: Tensor
                         ) -> tuple[Tensor, ...]:  # fmt: skip
        full = [torch.cat([s, c], dim=2) for s, c in zip(self.sink_kv(), caches, strict=True)]
        return self.inner.forward_explicit(token_ids, input_pos + self.n_sink, *full)

    def forward(self, token_ids: Tensor, input_pos: Tensor) -> Tensor:
        out: Tensor = self.inner(token_ids, input_pos + self.n_sink)
        return out

    def forward_train(self, token_ids: Tensor, *, last_only: bool = False) -> Tensor:
        sink = torch.tensor([self.tokens]).expand(token_ids.shape[0], -1)
        ids = torch.cat([sink, token_ids], dim=1)
        return self.inner.forward_train(ids, last_only=last_only)[:, self.n_sink :]

    def reset_cache(self) -> None:
        """Zero caches with the sink's K/V in the first slots (the stateful ``forward`` attends to
        them)."""
        self.inner.reset_cache()
        for cache, s in zip(self.inner._caches(), self.sink_kv(), strict=True):
            cache[:, :, : self.n_sink] = s


def sinked(model: Transformer, tokens: int | Sequence[int]) -> Transformer:
    """A ``SinkModel`` typed as the model it stands in for (same call styles and ``args``)."""
    return cast(Transformer, SinkModel(model, tokens))


def format_sink(tokens: Sequence[int]) -> str:
    """The ``SINK_KEY`` metadata value: the sink's token ids, comma-separated."""
    return ",".join(str(int(t)) for t in tokens)


def parse_sink(value: str) -> tuple[int, ...]:
    """``format_sink``'s inverse (a single id, as graphs of one sink token hold, included)."""
    try:
        tokens = tuple(int(t) for t in value.split(","))
    except ValueError:
        raise ValueError(f"sink metadata {value!r} is not comma-separated token ids") from None
    if any(t < 0 for t in tokens):
        raise ValueError(f"sink metadata {value!r} holds a negative token id")
    return tokens
