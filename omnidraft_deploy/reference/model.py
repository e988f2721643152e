"""Eager Llama / Qwen2 decoder with a static KV cache (gpt-fast style), the single model implementation.

Used for tiny random-initialised presets, for real weights loaded from Hugging Face folders or GGUF
files (``hf_adapter``), as the eager reference for every exported graph, and for distillation.
Parameter names equal Hugging Face's (``model.layers.0.self_attn.q_proj.weight`` ...) so a HF state
dict loads without renaming; RoPE uses HF's rotate-half convention for the same reason.

Three ways to run attention, one code path:
- ``forward(token_ids, input_pos)``: stateful, KV cache in (non-persistent) buffers updated in place.
  Rollback is free: positions past the committed length are simply overwritten by the next call,
  because the mask only lets position ``p`` see cache slots ``<= p``.
- ``forward_explicit(token_ids, input_pos, *caches)``: functional, past caches in, this chunk's new
  k/v entries out; the host writes them back (ONNX/QNN: no scatter op inside the graph).
- ``forward_train(token_ids)``: no cache, plain causal attention (distillation, autograd).

Shapes: ``token_ids (1, T)`` int64, ``input_pos (T,)`` int64 absolute positions, logits ``(1, T, V)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from omnidraft_deploy.catalog.presets import Family, ModelSpec
from omnidraft_deploy.reference.rope import RopeScaling
from omnidraft_deploy.reference.rope import rope_tables as rope_tables  # re-exported


@dataclass(frozen=True)
class ModelArgs:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    intermediate_size: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    qkv_bias: bool = False
    tie_embeddings: bool = False
    max_seq_len: int = 512
    rope_scaling: RopeScaling | None = None  # Llama-3.x frequency scaling (reference.rope)

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @classmethod
    def from_spec(cls, spec: ModelSpec, max_seq_len: int | None = None) -> ModelArgs:
        return cls(
            vocab_size=spec.vocab_size,
            dim=spec.dim,
            n_layers=spec.n_layers,
            n_heads=spec.n_heads,
            n_kv_heads=spec.n_kv_heads,
            intermediate_size=spec.intermediate_size,
            rope_theta=spec.rope_theta,
            norm_eps=spec.norm_eps,
            qkv_bias=spec.family is Family.QWEN2,
            tie_embeddings=spec.tie_embeddings,
            max_seq_len=max_seq_len or spec.max_seq_len,
        )


SPAN_BLOCK = 64  # an eager stateful call attends to its slots in whole blocks of this many
KVCaches = list[Tensor]  # [k_0, v_0, k_1, v_1, ...], each (1, n_kv_heads, max_seq_len, head_dim)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: (1, H, T, D); cos/sin: (T, D)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def masked_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    """softmax over the slots where ``mask`` (broadcastable 0/1 float) is 1, without infinities.

    Equals a -inf masked softmax, but every tensor stays finite and in the range of the real
    scores: what uint8 QDQ graphs on an NPU need (a -inf or -1e9 fill is rejected by QNN's
    ElementWiseSelect or wipes out the quantisation range of the scores). Masked slots are first
    zeroed (so nothing depends on what stale or later cache slots hold: a quantised graph gives
    the same numbers however the tokens are chunked), then set to the row's minimum, which is at
    most every real score, so the max is a real slot's and that slot's weight is exactly 1. (Taking
    the max over zeroed slots instead underflows every real weight to 0 when all real scores are
    below about -88, as Qwen2.5's attention produces: 0/0 = NaN.)
    """
    masked = scores * mask
    masked = masked + (1.0 - mask) * masked.amin(dim=-1, keepdim=True)
    weights = torch.exp(masked - masked.amax(dim=-1, keepdim=True)) * mask
    return weights / weights.sum(dim=-1, keepdim=True)


class Attention(nn.Module):
    def __init__(self, a: ModelArgs) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = a.n_heads, a.n_kv_heads, a.head_dim
        # An exporter may plug in its own stateful attention (``exporters.xnnpack.llm_attention``:
        # ExecuTorch's in-place cache update), called as ``kv_attend(q, k, v, input_pos, mask)
        # -> (1, T, H * D)`` instead of the model's buffers; ONNX / QNN / eager leave it None.
        self.kv_attend: nn.Module | None = None
        self.q_proj = nn.Linear(a.dim, a.n_heads * a.head_dim, bias=a.qkv_bias)
        self.k_proj = nn.Linear(a.dim, a.n_kv_heads * a.head_dim, bias=a.qkv_bias)
        self.v_proj = nn.Linear(a.dim, a.n_kv_heads * a.head_dim, bias=a.qkv_bias)
        self.o_proj = nn.Linear(a.n_heads * a.head_dim, a.dim, bias=False)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        mask: Tensor,
        input_pos: Tensor | None,
        cache: tuple[Tensor, Tensor] | None,
        inplace: bool,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """x: (1, T, dim); mask: (T, keys) float, 1 = may attend. Returns (out, k, v) where k, v
        (1, KV, T, D) are this chunk's new cache entries."""
        _, t, _ = x.shape
        # -1, not t: a view whose only dynamic size is inferred is delegated to XNNPACK, one that
        # names T is not (a portable op between delegated ones splits the layer's partition)
        q = self.q_proj(x).view(1, -1, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(1, -1, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(1, -1, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.kv_attend is not None and inplace:
            return self.o_proj(self.kv_attend(q, k, v, input_pos, mask)), k, v
        k_new, v_new = k, v
        if cache is not None and inplace:  # stateful: write into the buffers, attend over them
            assert input_pos is not None
            cache[0].index_copy_(2, input_pos, k)
            cache[1].index_copy_(2, input_pos, v)
            k, v = cache  # (1, KV, S, D)
            if mask.shape[-1] < k.shape[2]:  # an eager call's span (``Transformer._span``)
                k, v = k[:, :, : mask.shape[-1]], v[:, :, : mask.shape[-1]]
        elif cache is not None:  # explicit: past slots + this chunk; the host writes k/v back
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)  # (1,KV,S+T,D)
        # GQA without materialising repeated k/v: query heads grouped per kv head
        rep = self.n_heads // self.n_kv_heads
        qg = q.view(1, self.n_kv_heads, rep, t, self.head_dim)  # (1, KV, rep, T, D)
        scores = (qg @ k.transpose(-2, -1)[:, :, None]) * (self.head_dim**-0.5)  # (1,KV,rep,T,S)
        out = masked_softmax(scores.float(), mask).to(q.dtype) @ v[:, :, None]  # (1,KV,rep,T,D)
        out = out.reshape(1, self.n_heads, t, self.head_dim)
        out = out.transpose(1, 2).reshape(1, t, self.n_heads * self.head_dim)
        return self.o_proj(out), k_new, v_new


class MLP(nn.Module):
    def __init__(self, a: ModelArgs) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(a.dim, a.intermediate_size, bias=False)
        self.up_proj = nn.Linear(a.dim, a.intermediate_size, bias=False)
        self.down_proj = nn.Linear(a.intermediate_size, a.dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, a: ModelArgs) -> None:
        super().__init__()
        self.self_attn = Attention(a)
        self.mlp = MLP(a)
        self.input_layernorm = RMSNorm(a.dim, a.norm_eps)
        self.post_attention_layernorm = RMSNorm(a.dim, a.norm_eps)


class Backbone(nn.Module):
    def __init__(self, a: ModelArgs) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(a.vocab_size, a.dim)
        self.layers = nn.ModuleList(DecoderLayer(a) for _ in range(a.n_layers))
        self.norm = RMSNorm(a.dim, a.norm_eps)


class Transformer(nn.Module):
    """Decoder-only LM; see the module docstring for the three call styles."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.model = Backbone(args)
        self.lm_head = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        cos, sin = rope_tables(args.head_dim, args.max_seq_len, args.rope_theta, args.rope_scaling)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        for i, shape in enumerate(self.cache_shapes()):
            self.register_buffer(f"kv_cache_{i}", torch.zeros(shape), persistent=False)

    def cache_shapes(self) -> list[tuple[int, int, int, int]]:
        a = self.args
        return [(1, a.n_kv_heads, a.max_seq_len, a.head_dim)] * (2 * a.n_layers)

    def _caches(self) -> KVCaches:
        return [getattr(self, f"kv_cache_{i}") for i in range(2 * self.args.n_layers)]

    def _run(
        self,
        token_ids: Tensor,
        input_pos: Tensor,
        caches: KVCaches | None,
        inplace: bool,
        last_only: bool = False,
        cache_slots: Tensor | None = None,
        logit_rows: Tensor | None = None,
    ) -> tuple[Tensor, KVCaches]:
        h = self.model.embed_tokens(token_ids)  # (1, T, dim)
        rope_cos: Tensor = self.rope_cos  # type: ignore[assignment]
        rope_sin: Tensor = self.rope_sin  # type: ignore[assignment]
        # index_select (Gather) rather than advanced indexing (GatherND): NPUs take Gather
        cos, sin = rope_cos.index_select(0, input_pos), rope_sin.index_select(0, input_pos)
        t = token_ids.shape[1]
        causal = torch.ones(t, t, device=h.device).tril()  # (T, T)
        slots = torch.arange(self.args.max_seq_len, device=h.device)
        if caches is None:
            mask = causal
        elif inplace:
            slots = slots[: self._span(input_pos)] if cache_slots is None else cache_slots
            mask = (slots[None, :] <= input_pos[:, None]).float()  # (T, S), (T, span) or (T, L)
        else:  # valid past slots are those before the chunk's first position
            past = (slots[None, :] < input_pos[:1, None]).float().expand(t, -1)
            mask = torch.cat([past, causal], dim=1)  # (T, S + T)
        new_caches: KVCaches = []
        layer: DecoderLayer
        for i, layer in enumerate(self.model.layers):  # type: ignore[assignment]
            cache = None if caches is None else (caches[2 * i], caches[2 * i + 1])
            attn, k, v = layer.self_attn(
                layer.input_layernorm(h), cos, sin, mask, input_pos, cache, inplace
            )
            h = h + attn
            h = h + layer.mlp(layer.post_attention_layernorm(h))
            new_caches += [k, v]
        if last_only:
            h = h[:, -1:]
        elif logit_rows is not None:  # the last R rows (R = its length: a shape when exported)
            torch._check(logit_rows.shape[0] <= t)
            h = h[:, t - logit_rows.shape[0] :]
        return self.lm_head(self.model.norm(h)), new_caches

    def _span(self, input_pos: Tensor) -> int:
        """Cache slots a stateful call attends to: every slot when traced (``torch.export``: the
        graph keeps its static shape), else the slots up to the call's last position in whole
        blocks of ``SPAN_BLOCK`` (the same logits: later slots get exact zero weights). Over all
        slots, an eager decode step spent most of its time copying the whole cache for the
        grouped-query matmuls: SmolLM2-135M with 4,096 slots, one thread, 465 ms of CPU a step,
        143 ms over its span."""
        if torch.compiler.is_exporting():
            return self.args.max_seq_len
        end = -(-(int(input_pos.max()) + 1) // SPAN_BLOCK) * SPAN_BLOCK
        return min(end, self.args.max_seq_len)

    def forward(
        self,
        token_ids: Tensor,
        input_pos: Tensor,
        cache_slots: Tensor | None = None,
        logit_rows: Tensor | None = None,
    ) -> Tensor:
        """Stateful step: (1, T) ids at absolute positions (T,) -> logits (1, T, V).
        ``cache_slots`` (L,): the slots the step attends to (``arange(start + T)``; default: the
        span ``_span`` picks), the mask's width; ``logit_rows`` (R,): logits of the last R rows
        only, (1, R, V) (``graph_contract``: a ``.pte``'s third and fourth inputs)."""
        logits, _ = self._run(
            token_ids, input_pos, self._caches(), inplace=True, cache_slots=cache_slots,
            logit_rows=logit_rows,
        )  # fmt: skip
        return logits

    def forward_explicit(
        self,
        token_ids: Tensor,
        input_pos: Tensor,
        *caches: Tensor,
    ) -> tuple[Tensor, ...]:
        """Functional step over host-held caches (ONNX/QNN graphs).

        Positions must be contiguous (``input_pos = start + arange(T)``): the chunk attends to
        cache slots ``< start`` and causally within itself. Returns ``(logits, k_0, v_0, ...)``
        with this chunk's new entries ``(1, KV, T, D)``; the host writes them into its caches at
        ``input_pos`` (no scatter inside the graph, which NPUs reject).
        """
        logits, new_caches = self._run(token_ids, input_pos, list(caches), inplace=False)
        return (logits, *new_caches)

    def forward_train(self, token_ids: Tensor, *, last_only: bool = False) -> Tensor:
        """Full causal pass without a cache: (1, T) -> (1, T, V) (or (1, 1, V)); differentiable."""
        positions = torch.arange(token_ids.shape[1], device=token_ids.device)
        logits, _ = self._run(token_ids, positions, None, inplace=False, last_only=last_only)
        return logits

    def reset_cache(self) -> None:
        for c in self._caches():
            c.zero_()


def build_model(
    spec: ModelSpec, *, seed: int = 0, max_seq_len: int | None = None, init_std: float = 0.02
) -> Transformer:
    """Random-initialised model of ``spec``'s architecture (deterministic given ``seed``)."""
    gen = torch.Generator().manual_seed(seed)
    model = Transformer(ModelArgs.from_spec(spec, max_seq_len))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                continue
            p.copy_(torch.randn(p.shape, generator=gen) * init_std)
    return model.eval()
