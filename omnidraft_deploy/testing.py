"""Small deterministic fakes for tests and examples: a byte-table tokenizer over a toy vocabulary.

``TableTokenizer`` implements ``TokenizerLike`` for a list of byte strings (index = id), with
greedy longest-match encoding. Two tables over the same alphabet give a deliberately mismatched
drafter/target pair small enough to enumerate exactly (statistical losslessness tests).
"""

from __future__ import annotations

import itertools
import random

import torch

from omnidraft_deploy.catalog.presets import Family, ModelSpec, Role, Source
from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.protocols import TokenizerLike
from omnidraft_deploy.reference.model import build_model
from omnidraft_deploy.reference.torch_lm import EagerLM
from omnidraft_deploy.vocab.mapper import VocabMapper, greedy_encode


class TableTokenizer:
    def __init__(
        self, name: str, pieces: list[bytes], *, eos_id: int | None = 0, bos_id: int | None = None
    ) -> None:
        self.name, self._pieces = name, list(pieces)
        self._bos, self._eos = bos_id, eos_id
        specials = {i for i in (bos_id, eos_id) if i is not None}
        self._special = frozenset(specials)
        self._index = {p: i for i, p in enumerate(pieces) if p and i not in specials}
        self._max = max(map(len, self._index))

    @property
    def vocab_size(self) -> int:
        return len(self._pieces)

    @property
    def bos_id(self) -> int | None:
        return self._bos

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return () if self._eos is None else (self._eos,)

    @property
    def special_ids(self) -> frozenset[int]:
        return self._special

    def encode(self, text: str) -> list[int]:
        return greedy_encode(text.encode("utf-8"), self._index, self._max)

    def decode(self, ids: list[int]) -> str:
        return b"".join(self._pieces[i] for i in ids if i not in self._special).decode(
            "utf-8", errors="replace"
        )

    def token_bytes(self, token_id: int) -> bytes:
        return self._pieces[token_id]

    def token_bytes_table(self) -> list[bytes]:
        return list(self._pieces)


def toy_pair() -> tuple[TableTokenizer, TableTokenizer]:
    """Drafter over single letters + one merge; target with merges the drafter lacks."""
    drafter = TableTokenizer("toy-drafter", [b"</s>", b"a", b"b", b"c", b" ", b"ab"])
    target = TableTokenizer(
        "toy-target", [b"<eos>", b"a", b"b", b"c", b" ", b"ab", b"bc", b" a", b"ca", b"abc"]
    )
    return drafter, target


def toy_spec(vocab: int, max_seq_len: int = 96) -> ModelSpec:
    """A 1-layer, 16-dim Llama for toy vocabularies (fast enough for thousands of samples)."""
    return ModelSpec(
        "toy", Role.TARGET, Family.LLAMA, "toy", vocab, 16, 1, 2, 1, 32,
        max_seq_len=max_seq_len, source=Source.RANDOM,
    )  # fmt: skip


class OracleDrafter:
    """A drafter (``CausalLM`` over the drafter vocabulary) that knows the target's continuation.

    ``target_pieces`` are the byte spellings of the target's tokens (prompt + continuation). Each
    row puts its argmax on the longest drafter token spelling the next bytes *within the current
    target token* (what a well-trained drafter does), except where a seeded coin marks the position
    wrong (probability ``error_rate``). Through real tokenizers this yields realistic accept/reject
    patterns, including target tokens that need several drafter tokens (what the n-gram cache
    merges), without any trained weights.
    """

    def __init__(
        self,
        drafter_tok: TokenizerLike,
        target_pieces: list[bytes],
        *,
        error_rate: float = 0.2,
        seed: int = 0,
        max_seq_len: int = 1024,
    ) -> None:
        self._table = [drafter_tok.token_bytes(i) for i in range(drafter_tok.vocab_size)]
        special = drafter_tok.special_ids
        self._index = {b: i for i, b in enumerate(self._table) if b and i not in special}
        self._max = max(map(len, self._index))
        self._special, self._text = special, b"".join(target_pieces)
        self._ends = list(itertools.accumulate(len(p) for p in target_pieces))
        self._error, self._seed, self._max_seq = error_rate, seed, max_seq_len
        self.shadow: list[int] = []

    @property
    def vocab_size(self) -> int:
        return len(self._table)

    @property
    def max_seq_len(self) -> int:
        return self._max_seq

    def _next(self, context: list[int]) -> int:
        done = b"".join(b"" if i in self._special else self._table[i] for i in context)
        wrong = random.Random(self._seed * 1_000_003 + len(context)).random() < self._error
        end = next((e for e in self._ends if e > len(done)), len(done))
        if wrong or not self._text.startswith(done) or end <= len(done):
            return len(self._table) - 1  # an arbitrary real token
        return greedy_encode(self._text[len(done) : end], self._index, self._max)[0]

    def forward(self, token_ids: torch.Tensor, start_pos: int) -> torch.Tensor:
        self.shadow = self.shadow[:start_pos] + token_ids.tolist()
        logits = torch.zeros(len(token_ids), self.vocab_size)
        for row in range(len(token_ids)):
            logits[row, self._next(self.shadow[: start_pos + row + 1])] = 10.0
        return logits


class BridgeDrafter:
    """A drafter that reads the target model through the tokenizers (a correlated proposal).

    Context drafter ids -> bytes -> text -> target ids (target tokenizer) -> the target model's
    last-position logits (no KV cache; ``forward_train``) -> each directly mapped drafter token gets
    the logit of its target twin plus a fixed seeded perturbation; unmapped tokens get -inf.
    Proposals are therefore close to, but not equal to, the target's distribution: acceptance and
    rejection are both exercised in statistical tests over real vocabularies. Memoised by context.
    """

    def __init__(
        self,
        target_model: torch.nn.Module,
        target_tok: TokenizerLike,
        drafter_tok: TokenizerLike,
        draft_to_target: torch.Tensor,
        *,
        noise: float = 1.0,
        seed: int = 0,
        max_seq_len: int = 1024,
    ) -> None:
        self._model, self._ttok, self._dtok = target_model, target_tok, drafter_tok
        self._d2t, self._max_seq = draft_to_target, max_seq_len
        gen = torch.Generator().manual_seed(seed)
        self._noise = torch.randn(len(draft_to_target), generator=gen) * noise
        self._memo: dict[tuple[int, ...], torch.Tensor] = {}
        self.shadow: list[int] = []

    @property
    def vocab_size(self) -> int:
        return len(self._d2t)

    @property
    def max_seq_len(self) -> int:
        return self._max_seq

    def _row(self, context: tuple[int, ...]) -> torch.Tensor:
        if context not in self._memo:
            special = self._dtok.special_ids
            text = b"".join(self._dtok.token_bytes(i) for i in context if i not in special)
            ids = self._ttok.encode(text.decode("utf-8", errors="replace")) or [0]
            with torch.no_grad():
                t_logits = self._model.forward_train(  # type: ignore[operator]
                    torch.tensor([ids]), last_only=True
                )[0, -1]
            mapped = self._d2t >= 0
            row = torch.full((len(self._d2t),), float("-inf"))
            row[mapped] = t_logits[self._d2t[mapped]] + self._noise[mapped]
            self._memo[context] = row
        return self._memo[context]

    def forward(self, token_ids: torch.Tensor, start_pos: int) -> torch.Tensor:
        self.shadow = self.shadow[:start_pos] + token_ids.tolist()
        return torch.stack(
            [self._row(tuple(self.shadow[: start_pos + r + 1])) for r in range(len(token_ids))]
        )


def toy_models(
    target_seed: int = 11,
    drafter_seed: int = 12,
    init_std: float = 0.6,
) -> tuple[EagerLM, EagerLM, VocabMapper]:
    """(target, drafter, mapper) on ``toy_pair``: peaky 1-layer models for exact enumeration."""
    dt, tt = toy_pair()
    target = EagerLM(build_model(toy_spec(tt.vocab_size, 16), seed=target_seed, init_std=init_std))
    drafter = EagerLM(
        build_model(toy_spec(dt.vocab_size, 32), seed=drafter_seed, init_std=init_std)
    )
    return target, drafter, VocabMapper.from_tokenizers(dt, tt)


def toy_ngram_cache() -> NGramCache:
    """The toy target's merges the drafter lacks, as the online cache would learn them."""
    dt, tt = toy_pair()
    cache = NGramCache(max_entries=16)
    for text in ("bc", "ca", " a", "abc"):
        cache.update(dt.encode(text), tt.encode(text)[0])
    return cache
