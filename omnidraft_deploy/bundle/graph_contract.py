"""The graph-call contract: how every exported graph is called, in one place.

Used by export verification (``exporters.verify``), calibration (``exporters.quant.calibration``), the
exporters that write the names (``exporters.exportable``, ``exporters.onnx.fused``) and the
runtime (``runtime.onnxruntime_model``, ``runtime.qnn_model``, ``runtime.executorch_model``).
No other module spells a graph input or output name.

ONNX graphs (explicit caches, T dynamic or static):

- inputs ``token_ids (1, T)`` int64, ``input_pos (T,)`` int64 (contiguous: ``start + arange(T)``),
  ``cache_{i} (1, KV, max_seq_len, D)`` float32 for i = 0 .. 2L-1 (k0, v0, k1, v1, ...);
- output ``logits (1, T, V)``: only this call's rows;
- fused graphs (``exporters.onnx.fused``) also take ``logits_from (1,)`` int64, an *overridable
  initializer* (a graph input with an initializer of the same name, value ``[0]``): logits come
  out for rows ``logits_from ..`` only, ``(1, T - logits_from, V)`` (the final norm is sliced
  before the lm_head). A caller that does not feed it gets every row, so old callers keep working;
  a caller that needs only the last ``n`` rows feeds ``T - n`` (a prefill or the drafter: one row;
  a prefill that also verifies the first step's proposals: their rows, ``decoder``): the lm_head
  (1536 x 151936 on Qwen2.5-Coder-1.5B, ~15% of a prefill row's FLOPs) runs n times, not T
  times (a 100-token prefill of an int8 SmolLM2-135M-sized graph: 52.9 ms instead of 62.7 ms).
  ONNX Runtime lists it in ``get_overridable_initializers()``, not ``get_inputs()``, and IOBinding's
  ``bind_cpu_input`` refuses it (it takes the type from the required inputs); an OrtValue binds
  (``tests/exporters/test_logits_from.py``). Graphs without it (traced, static-T, older bundles)
  compute every row and the host keeps the tail (``ExplicitCacheGraph.run(rows=n)``);
- ``CacheIO.CHUNK`` graphs (plain ops: QNN, swappable drafters) output ``cache_out_{i} (1, KV, T,
  D)``, this chunk's new entries, which the host writes at ``input_pos``;
- ``CacheIO.SHARED`` graphs (fused GroupQueryAttention: ``exporters.onnx.fused``) output
  ``present_{i}`` bound to the same buffer as ``cache_{i}``: the graph writes in place.

Either way the caches live in preallocated host buffers wrapped once as ``OrtValue``s and bound
through IOBinding: nothing is copied per call beyond the new entries (CHUNK) and the logits.
Rollback is calling again from an earlier position: stale slots past it are masked by position
and then overwritten. Static-T graphs (``GraphInfo.seq_len``: NPU) are fed in chunks of exactly
T tokens; a short chunk is padded with copies of its last token at the following positions
(padded rows come last, so causal masking keeps them out of the real rows, and their entries
are never written back).

ExecuTorch ``.pte`` programs: ``forward(token_ids (1, T), input_pos (T,)[, cache_slots (L,),
logit_rows (R,)]) -> logits (1, R, V)``, KV cache as program state; metadata as constant methods
``get_*`` (``pte_constants``). Programs whose attention reads only the slots in use
(``exporters.xnnpack.llm_attention``'s ``prefix``) take two more inputs whose *lengths* carry
numbers, because XNNPACK plans only shapes derived from inputs, not values computed in the graph:
``cache_slots`` = ``arange(start + T)``, the slots the call attends to, and ``logit_rows`` (any
int64 values) whose length R (1 <= R <= T) is how many of the last rows get logits (a prefill
needs one: the lm_head runs R times, not T times, as ``logits_from`` does in ONNX graphs). Such
programs say ``get_forward_inputs() == 4``; ``pte_step`` reads the count from the method's own
metadata, so older two-input programs keep working (all T rows).
ONNX Runtime and ExecuTorch are imported lazily.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import numpy as np

from omnidraft_deploy.bundle.sections import GraphInfo

TOKEN_IDS = "token_ids"
INPUT_POS = "input_pos"
LOGITS = "logits"
LOGITS_FROM = "logits_from"  # optional (1,) int64 input, default [0]: see the module docstring
PTE_FORWARD = "forward"
PTE_INPUTS_WITH_SPANS = 4  # token_ids, input_pos, cache_slots, logit_rows


def cache_in(i: int) -> str:
    return f"cache_{i}"


def cache_chunk_out(i: int) -> str:
    return f"cache_out_{i}"


def cache_present(i: int) -> str:
    return f"present_{i}"


class CacheIO(StrEnum):
    CHUNK = "chunk"  # graph returns the chunk's entries; the host writes them
    SHARED = "shared"  # graph writes into the bound cache buffer (past/present share memory)


def input_names(n_layers: int) -> list[str]:
    """ONNX input names: token_ids, input_pos, cache_0 .. cache_{2L-1}."""
    return [TOKEN_IDS, INPUT_POS, *(cache_in(i) for i in range(2 * n_layers))]


def output_names(n_layers: int, cache_io: CacheIO = CacheIO.CHUNK) -> list[str]:
    """ONNX output names: logits, then cache_out_i (CHUNK) or present_i (SHARED)."""
    name = cache_chunk_out if cache_io is CacheIO.CHUNK else cache_present
    return [LOGITS, *(name(i) for i in range(2 * n_layers))]


def cache_io_of(output_names_: list[str]) -> CacheIO:
    """Which cache convention a graph with these outputs follows (ValueError if neither)."""
    if output_names_ and output_names_[0] == LOGITS:
        for io in CacheIO:
            if output_names_ == output_names(len(output_names_[1:]) // 2, io):
                return io
    raise ValueError(f"graph outputs {output_names_[:3]}... follow no omnidraft cache contract")


def takes_logits_from(session: Any) -> bool:
    """Whether ``session``'s graph takes ``LOGITS_FROM`` (ONNX Runtime lists an overridable
    initializer apart from the inputs; a graph may also declare it a plain input)."""
    inputs = [*session.get_inputs(), *session.get_overridable_initializers()]
    return any(i.name == LOGITS_FROM for i in inputs)


def contiguous_positions(start_pos: int, t: int) -> np.ndarray:
    return np.arange(start_pos, start_pos + t, dtype=np.int64)


def static_chunks(
    token_ids: np.ndarray, input_pos: np.ndarray, t_static: int, max_seq_len: int
) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """``(ids (1, T), pos (T,), n_real)`` chunks of exactly ``t_static`` (short one padded)."""
    out = []
    for s in range(0, token_ids.shape[1], t_static):
        ids, pos = token_ids[:, s : s + t_static], input_pos[s : s + t_static]
        n = ids.shape[1]
        if n < t_static:
            pad = t_static - n
            ids = np.concatenate([ids, np.repeat(ids[:, -1:], pad, axis=1)], axis=1)
            extra = np.minimum(pos[-1] + 1 + np.arange(pad), max_seq_len - 1)
            pos = np.concatenate([pos, extra]).astype(np.int64)
        out.append((ids, pos, n))
    return out


class ExplicitCacheGraph:
    """One ONNX Runtime session plus its host-held caches, stepped by position via IOBinding.

    ``caches``: the numpy buffers ``(1, KV, max_seq_len, D)``, aliased by the bound OrtValues
    (writing into them changes what the next call sees; they cannot be replaced, only ``reset``).
    """

    def __init__(self, session: Any, info: GraphInfo, *, decode: Any | None = None) -> None:
        """``decode``: a T = 1 session of the same function beside a static-T ``session`` (NPU
        graphs): one-token calls run there instead of a padded T-token call; same caches."""
        import onnxruntime as ort

        self.session, self.info, self.decode = session, info, decode
        self.cache_io = cache_io_of([o.name for o in session.get_outputs()])
        if (
            decode is not None
            and cache_io_of([o.name for o in decode.get_outputs()]) != self.cache_io
        ):
            raise ValueError("the decode graph follows another cache contract than the graph")
        vocab = session.get_outputs()[0].shape[-1]  # logits (1, T, V)
        self._vocab = vocab if isinstance(vocab, int) else info.vocab_size
        self._ort = ort
        # a dynamic-T graph that takes LOGITS_FROM computes the rows a tail call asks for alone
        self.tail_alone = info.seq_len is None and takes_logits_from(session)
        self._from = np.zeros(1, np.int64)  # LOGITS_FROM, bound once as an OrtValue over it
        self._from_value = ort.OrtValue.ortvalue_from_numpy(self._from)
        self.reset()

    def reset(self) -> None:
        """Fresh zero caches (new buffers and bindings)."""
        info = self.info
        shape = (1, info.n_kv_heads, info.max_seq_len, info.head_dim)
        self._caches = tuple(np.zeros(shape, np.float32) for _ in range(2 * info.n_layers))
        self._values = [self._ort.OrtValue.ortvalue_from_numpy(c) for c in self._caches]
        self._binding = self._bind(self.session)
        self._decode_binding: Any = None if self.decode is None else self._bind(self.decode)

    def _bind(self, session: Any) -> Any:
        """An IOBinding of ``session`` on this graph's cache buffers."""
        binding = session.io_binding()
        for i, value in enumerate(self._values):
            binding.bind_ortvalue_input(cache_in(i), value)
        if takes_logits_from(session):  # ``bind_cpu_input`` refuses an overridable initializer
            binding.bind_ortvalue_input(LOGITS_FROM, self._from_value)
        binding.bind_output(LOGITS, "cpu")  # outputs come back in binding order
        for i, value in enumerate(self._values):
            if self.cache_io is CacheIO.SHARED:
                binding.bind_ortvalue_output(cache_present(i), value)  # written in place
            else:
                binding.bind_output(cache_chunk_out(i), "cpu")
        return binding

    def _rebind_t_shaped(self, binding: Any) -> None:
        """Outputs whose shape follows T are bound to ``cpu`` afresh each call (ORT keeps the
        buffer it allocated for a bound output, whose T would be stale); rebinding a name keeps
        its place in the output order."""
        binding.bind_output(LOGITS, "cpu")
        if self.cache_io is CacheIO.CHUNK:
            for i in range(len(self._values)):
                binding.bind_output(cache_chunk_out(i), "cpu")

    @property
    def caches(self) -> tuple[np.ndarray, ...]:
        return self._caches

    def feeds(self, token_ids: np.ndarray, input_pos: np.ndarray) -> dict[str, np.ndarray]:
        """The full input dict of one call, caches copied (calibration data readers)."""
        caches = {cache_in(i): c.copy() for i, c in enumerate(self.caches)}
        return {TOKEN_IDS: token_ids, INPUT_POS: input_pos, **caches}

    def _call(
        self, ids: np.ndarray, pos: np.ndarray, n_real: int, *, decode: bool = False,
        rows: int | None = None,
    ) -> np.ndarray:  # fmt: skip
        """Logits ``(T, V)``, or the last ``rows`` alone, ``(rows, V)`` (the graph takes
        LOGITS_FROM)."""
        session: Any
        session, b = (
            (self.decode, self._decode_binding) if decode else (self.session, self._binding)
        )
        b.bind_cpu_input(TOKEN_IDS, np.ascontiguousarray(ids, dtype=np.int64))
        b.bind_cpu_input(INPUT_POS, np.ascontiguousarray(pos, dtype=np.int64))
        t = ids.shape[1]
        self._from[0] = 0 if rows is None else t - rows  # every call sets it: the binding keeps it
        if self.cache_io is CacheIO.SHARED:
            return self._call_shared(session, b, t if rows is None else rows)
        self._rebind_t_shaped(b)
        session.run_with_iobinding(b)
        logits, *new = b.get_outputs()
        for cache, entries in zip(self.caches, new, strict=True):
            cache[:, :, pos[:n_real], :] = entries.numpy()[:, :, :n_real, :]  # host write
        return np.asarray(logits.numpy()[0])

    def _call_shared(self, session: Any, binding: Any, rows: int) -> np.ndarray:
        """SHARED graphs: the caches are bound once, so ORT writes the logits straight into a
        fresh array (the caller keeps it): no output list to fetch (2L+1 OrtValue wrappers, the
        largest host cost of a 1-token call) and no arena buffer to hand over. ``rows``: T, or
        the tail a call asked for."""
        logits = np.empty((1, rows, self._vocab), np.float32)  # (1, rows, V)
        binding.bind_output(LOGITS, "cpu", 0, np.float32, list(logits.shape), logits.ctypes.data)
        session.run_with_iobinding(binding)
        return logits[0]

    def run(
        self, token_ids: np.ndarray, input_pos: np.ndarray, *, rows: int | None = None
    ) -> np.ndarray:
        """``token_ids (1, T)`` at ``input_pos (T,)`` -> logits ``(T, V)``; caches updated. A
        static-T graph takes chunks of T (``static_chunks``); one token goes to ``decode``.

        ``rows``: only the last ``rows`` rows, ``(rows, V)`` (1 <= rows <= T): computed alone
        where the graph takes ``LOGITS_FROM`` (``tail_alone``), else cut from every row (same
        values)."""
        t = token_ids.shape[1]
        if rows is not None and not 1 <= rows <= t:
            raise ValueError(f"rows {rows} of a {t}-token call: want 1..{t}")
        if self.decode is not None and t == 1:
            return self._call(token_ids, input_pos, 1, decode=True)
        if self.info.seq_len is None:
            alone = rows if self.tail_alone else None
            logits = self._call(token_ids, input_pos, t, rows=alone)
        else:
            chunks = static_chunks(token_ids, input_pos, self.info.seq_len, self.info.max_seq_len)
            logits = np.concatenate([self._call(i, p, n)[:n] for i, p, n in chunks], axis=0)
        return logits if rows is None else logits[-rows:]


def pte_step(
    method: Any, token_ids: np.ndarray, input_pos: np.ndarray, rows: int | None = None
) -> np.ndarray:
    """One ``.pte`` ``forward`` call: ``(1, T)`` ids at ``(T,)`` positions -> logits ``(T, V)``,
    or the last ``rows`` rows ``(rows, V)`` (scored alone by programs that take ``logit_rows``,
    cut from all T by older ones: module docstring)."""
    import torch

    inputs = pte_inputs(method.metadata.num_inputs(), torch.from_numpy(token_ids),
                        torch.from_numpy(input_pos), rows)  # fmt: skip
    out = np.asarray(method.execute(inputs)[0][0].float().numpy())
    return out if rows is None else out[-rows:]


def pte_inputs(n_inputs: int, token_ids: Any, input_pos: Any, rows: int | None = None) -> list[Any]:
    """The ``forward`` inputs of ``token_ids`` (1, T) at ``input_pos`` (T,) (torch tensors) for a
    program taking ``n_inputs``: the spans (``cache_slots``, ``logit_rows``: the last ``rows``
    rows, default all T) where it takes them (module docstring)."""
    import torch

    inputs = [token_ids, input_pos]
    if n_inputs == PTE_INPUTS_WITH_SPANS:
        t = len(input_pos)
        inputs += [torch.arange(int(input_pos[0]) + t), torch.zeros(rows or t, dtype=torch.long)]
    return inputs


def pte_constants(program: Any) -> dict[str, Any]:
    """Values of a loaded ``.pte`` program's constant methods (``get_max_seq_len``, ...)."""
    return {
        name: program.load_method(name).execute([])
        for name in sorted(program.method_names)
        if name.startswith("get_")
    }
