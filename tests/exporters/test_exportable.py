"""The KV cache checked at every stage: eager stateful, eager explicit, exported programs.

(The reloaded artifacts continue the chain in test_onnx_tiny.py and test_executorch_tiny.py.)
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from omnidraft_deploy.exporters.exportable import (
    ExplicitCacheExportable,
    StatefulExportable,
    dynamic_shapes_explicit,
    dynamic_shapes_stateful,
    empty_caches,
    example_inputs,
    graph_info,
    input_names,
    output_names,
)

from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.reference.model import Transformer, build_model

SPEC = dataclasses.replace(get_preset("tiny-llama3-8b"), vocab_size=300)  # GQA: 4 heads, 2 kv
PROMPT, NEXT = [3, 17, 250, 9, 41], [77]


def _model() -> Transformer:
    return build_model(SPEC, seed=11, max_seq_len=16)


def _eager_run(model: Transformer) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    model.reset_cache()
    a = model(torch.tensor([PROMPT]), torch.arange(5))
    b = model(torch.tensor([NEXT]), torch.tensor([5]))
    return a, b, [model.get_buffer(f"kv_cache_{i}")[:, :, :6].clone() for i in range(4)]


def _explicit_run(run, caches: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Host-side cache writes, as the runtime does: cache_out_i holds this chunk's entries."""
    outs = []
    for tokens, start in ((PROMPT, 0), (NEXT, 5)):
        pos = torch.arange(start, start + len(tokens))
        logits, *new = run(torch.tensor([tokens]), pos, *caches)
        for c, n in zip(caches, new, strict=True):
            c[:, :, pos] = n if n.shape[2] == len(tokens) else n[:, :, pos]
        outs.append(logits)
    return outs[0], outs[1]


def test_explicit_matches_stateful_logits_and_cache() -> None:
    model = _model()
    a, b, eager_cache = _eager_run(model)
    caches = empty_caches(model)
    with torch.no_grad():
        ea, eb = _explicit_run(ExplicitCacheExportable(model), caches)
    torch.testing.assert_close(ea, a, atol=1e-5, rtol=0)
    torch.testing.assert_close(eb, b, atol=1e-5, rtol=0)
    for host, ref in zip(caches, eager_cache, strict=True):
        torch.testing.assert_close(host[:, :, :6], ref, atol=1e-6, rtol=0)
        assert float(host[:, :, :6].abs().sum()) > 0  # really written


def test_exported_stateful_program_keeps_its_cache() -> None:
    model = _model()
    a, b, eager_cache = _eager_run(model)
    ids, pos = example_inputs(model, 2)
    ep = torch.export.export(
        StatefulExportable(_model()), (ids, pos), dynamic_shapes=dynamic_shapes_stateful(model)
    )
    prog = ep.module()
    pa = prog(torch.tensor([PROMPT]), torch.arange(5))
    pb = prog(torch.tensor([NEXT]), torch.tensor([5]))  # T = 1 through the dynamic dim
    torch.testing.assert_close(pa, a, atol=1e-5, rtol=0)
    torch.testing.assert_close(pb, b, atol=1e-5, rtol=0)
    buffers = dict(prog.named_buffers())
    for i, ref in enumerate(eager_cache):
        torch.testing.assert_close(buffers[f"model.kv_cache_{i}"][:, :, :6], ref, atol=1e-6, rtol=0)


def test_exported_explicit_program_matches_eager() -> None:
    model = _model()
    a, b, eager_cache = _eager_run(model)
    ids, pos = example_inputs(model, 2)
    ep = torch.export.export(
        ExplicitCacheExportable(model), (ids, pos, *empty_caches(model)),
        dynamic_shapes=dynamic_shapes_explicit(model),
    )  # fmt: skip
    caches = empty_caches(model)
    ea, eb = _explicit_run(ep.module(), caches)
    torch.testing.assert_close(ea, a, atol=1e-5, rtol=0)
    torch.testing.assert_close(eb, b, atol=1e-5, rtol=0)
    for host, ref in zip(caches, eager_cache, strict=True):
        torch.testing.assert_close(host[:, :, :6], ref, atol=1e-6, rtol=0)


def test_names_inputs_and_graph_info() -> None:
    model = _model()
    assert input_names(2) == ["token_ids", "input_pos", "cache_0", "cache_1", "cache_2", "cache_3"]
    assert output_names(2)[0] == "logits" and output_names(2)[-1] == "cache_out_3"
    assert [tuple(c.shape) for c in empty_caches(model)] == [(1, 2, 16, 16)] * 4
    with pytest.raises(ValueError, match="seq_len 17 outside"):
        example_inputs(model, 17)
    info = graph_info(model, SPEC, file="target.onnx", quantization="fp32", seq_len=None)
    assert (info.vocab_size, info.max_seq_len, info.n_kv_heads, info.head_dim) == (300, 16, 2, 16)
    assert info.tokenizer == "llama3" and info.seq_len is None


def test_eager_calls_attend_to_their_span_with_the_same_logits() -> None:
    """An eager stateful call attends to the slots up to its last position in blocks of 64
    (``Transformer._span``), a traced one to every slot; stale values in later slots (a rolled
    back draft) get exact zero weight either way, so each step equals a cache-free causal pass."""
    model = build_model(SPEC, seed=11, max_seq_len=256)
    spans = [model._span(torch.tensor([p])) for p in (0, 63, 64, 200, 255)]
    assert spans == [64, 64, 128, 256, 256]
    ids = torch.randint(1, SPEC.vocab_size, (1, 80), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        for i in range(4):  # garbage in every slot the steps below must not see
            model.get_buffer(f"kv_cache_{i}").normal_(0, 50)
        model(ids[:, :60], torch.arange(60))
        for p in range(60, 80):  # crosses the block boundary at 64
            step = model(ids[:, p : p + 1], torch.tensor([p]))[0, -1]
            full = model.forward_train(ids[:, : p + 1])[0, -1]
            torch.testing.assert_close(step, full, atol=1e-5, rtol=0)
