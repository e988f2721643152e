"""Export-ready wrappers around ``reference.model.Transformer`` and their example inputs.

Two I/O conventions (the contract with ``runtime/`` and the Android demo):

- ``StatefulExportable`` (ExecuTorch ``.pte``): ``forward(token_ids (1,T) int64, input_pos (T,)
  int64[, cache_slots (L,), logit_rows (R,)]) -> logits (1,R,V)``; the KV cache lives in mutable
  buffers inside the program (the two optional inputs: ``graph_contract``).
- ``ExplicitCacheExportable`` (ONNX / QNN): ``forward(token_ids, input_pos, cache_0..cache_{2L-1})
  -> (logits, cache_out_0..)``; caches are float32 ``(1, n_kv_heads, max_seq_len, head_dim)`` in
  the order k0, v0, k1, v1, ...; ``cache_out_i`` is ``(1, n_kv_heads, T, head_dim)``: this chunk's
  new entries, which the host writes at ``input_pos`` (positions must be contiguous). Keeping the
  scatter on the host keeps ScatterND out of the graph (QNN HTP rejects it) and avoids copying
  whole caches out of every call.

T is dynamic in ``[1, max_seq_len]`` (``dynamic_shapes_*``) unless a static ``seq_len`` is asked
for (NPU graphs: ``seq_len = draft_len + 1``). ``max_seq_len`` is fixed when the model is built
(``build_model(spec, max_seq_len=...)`` / ``hf_adapter.load_model(path, max_seq_len=...)``).
I/O names: ``omnidraft_deploy.bundle.graph_contract`` (re-exported here). Stable API (used by ``exporters.onnx``, ``exporters.qnn``, tests): the two wrappers,
``example_inputs``, ``empty_caches``, ``input_names``, ``output_names``, ``dynamic_shapes_*``,
``graph_info``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from omnidraft_deploy.bundle.graph_contract import input_names as input_names  # re-exported
from omnidraft_deploy.bundle.graph_contract import output_names as output_names
from omnidraft_deploy.bundle.sections import GraphInfo
from omnidraft_deploy.catalog.presets import ModelSpec
from omnidraft_deploy.reference.model import ModelArgs, Transformer


class StatefulExportable(nn.Module):
    """``forward(token_ids (1,T), input_pos (T,)[, cache_slots (L,), logit_rows (R,)]) -> logits
    (1,R,V)``; KV cache in buffers. ``cache_slots`` (``arange(start + T)``, the slots the call
    attends to) and ``logit_rows`` (its length: how many last rows get logits) are inputs of
    programs whose attention reads only the slots in use (``graph_contract``)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        token_ids: Tensor,
        input_pos: Tensor,
        cache_slots: Tensor | None = None,
        logit_rows: Tensor | None = None,
    ) -> Tensor:  # the signature torch.export reads; the model's own forward takes the same
        out: Tensor = self.model(token_ids, input_pos, cache_slots, logit_rows)
        return out


class ExplicitCacheExportable(nn.Module):
    """``forward(token_ids, input_pos, *caches) -> (logits, *cache_out)``; host-held caches."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, token_ids: Tensor, input_pos: Tensor, *caches: Tensor) -> tuple[Tensor, ...]:
        return self.model.forward_explicit(token_ids, input_pos, *caches)


def _args(model: Transformer | ModelArgs) -> ModelArgs:
    return model if isinstance(model, ModelArgs) else model.args


def example_inputs(model: Transformer | ModelArgs, seq_len: int = 2) -> tuple[Tensor, Tensor]:
    """(token_ids (1, T) zeros, input_pos (T,) = arange(T)) for tracing; T = ``seq_len``."""
    if not 1 <= seq_len <= _args(model).max_seq_len:
        raise ValueError(f"seq_len {seq_len} outside [1, max_seq_len={_args(model).max_seq_len}]")
    return torch.zeros(1, seq_len, dtype=torch.long), torch.arange(seq_len, dtype=torch.long)


def empty_caches(model: Transformer | ModelArgs) -> list[Tensor]:
    """Zero caches, 2 * n_layers tensors (1, n_kv_heads, max_seq_len, head_dim) float32."""
    a = _args(model)
    return [torch.zeros(1, a.n_kv_heads, a.max_seq_len, a.head_dim) for _ in range(2 * a.n_layers)]


def _seq_dim(a: ModelArgs) -> Any:
    # min 1: a size-1 example would be specialised by torch.export, so trace with T >= 2
    return torch.export.Dim("T", min=1, max=a.max_seq_len)


def dynamic_shapes_stateful(
    model: Transformer | ModelArgs, *, bounded: bool = True, cache_slots: bool = False
) -> tuple[dict[int, Any], ...]:
    """``torch.export`` dynamic_shapes for ``StatefulExportable``: T dynamic in [1, max_seq_len].

    ``bounded=False``: ``Dim.DYNAMIC``, the range left to the model's own checks (the in-place
    attention of ``exporters.xnnpack.llm_attention`` checks ``T <= S``). A bounded ``Dim`` fails
    there: the (1, T) view of its grouped output yields a contiguity guard (``T * min(D, rep * D
    * T) == D * T``) that holds for every T >= 1 but that torch.export cannot prove over a range.
    ``cache_slots``: the lengths of the third and fourth inputs (``cache_slots``' ``start + T``,
    ``logit_rows``' R) dynamic too (unbounded: the model checks ``L <= S`` and ``R <= T``).
    """
    t = _seq_dim(_args(model)) if bounded else torch.export.Dim.DYNAMIC
    spans = ({0: torch.export.Dim.DYNAMIC}, {0: torch.export.Dim.DYNAMIC})
    return ({1: t}, {0: t}) + (spans if cache_slots else ())


def dynamic_shapes_explicit(model: Transformer | ModelArgs) -> tuple[Any, ...]:
    """Same for ``ExplicitCacheExportable`` (caches keep their static shape).

    ``Dim.DYNAMIC`` rather than a bounded ``Dim``: concatenating the past cache with the chunk
    yields guards (``min(S*D + T*D, ...)``) that torch.export cannot prove over a bounded range.
    ONNX graphs need no upper bound; the runtime keeps ``start + T <= max_seq_len``.
    """
    a = _args(model)
    t = torch.export.Dim.DYNAMIC
    return ({1: t}, {0: t}, tuple([None] * (2 * a.n_layers)))


def graph_info(
    model: Transformer,
    spec: ModelSpec,
    *,
    file: str,
    quantization: str,
    seq_len: int | None,
    parity: dict[str, float] | None = None,
) -> GraphInfo:
    """Manifest ``GraphInfo`` of one exported graph (``seq_len`` None = dynamic T)."""
    a = model.args
    return GraphInfo(
        file=file,
        preset=spec.name,
        family=spec.family.value,
        tokenizer=spec.tokenizer,
        vocab_size=a.vocab_size,
        max_seq_len=a.max_seq_len,
        seq_len=seq_len,
        n_layers=a.n_layers,
        n_kv_heads=a.n_kv_heads,
        head_dim=a.head_dim,
        quantization=quantization,
        parity=parity or {},
    )
