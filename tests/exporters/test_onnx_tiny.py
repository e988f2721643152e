"""ONNX recipe on a small model: reloaded graph (and .ort) vs eager, metadata, cache outputs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from omnidraft_deploy.exporters.exportable import graph_info, input_names, output_names
from omnidraft_deploy.exporters.verify import ExportVerificationError, verify_artifact

from omnidraft_deploy.bundle.sections import GraphInfo
from omnidraft_deploy.catalog.backends import get_recipe
from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.reference.model import Transformer, build_model

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

SPEC = dataclasses.replace(get_preset("tiny-qwen2-7b"), vocab_size=384)  # GQA + qkv bias
PROMPTS = [[5, 9, 100, 3, 44, 17], [7, 8]]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Transformer, Path, GraphInfo]:
    from omnidraft_deploy.exporters.onnx.graph import export_onnx

    model = build_model(SPEC, seed=5, max_seq_len=32)
    path = tmp_path_factory.mktemp("onnx") / "target.onnx"
    info = graph_info(model, SPEC, file=path.name, quantization="fp32", seq_len=None)
    export_onnx(model, path, info=info, recipe=get_recipe("onnx", "fp32"), bundle_hash="h123")
    return model, path, info


def test_reloaded_onnx_matches_eager_incl_rollback(exported) -> None:
    model, path, info = exported
    result = verify_artifact(path, info, model, get_recipe("onnx", "fp32"), PROMPTS)
    assert result["max_abs_logit_diff"] < 1e-4 and result["top1_agreement"] == 1.0
    assert result["rollback_max_abs_diff"] < 1e-4 and result["rows"] == 6 + 2 + 2 * 6


def test_metadata_and_io_names(exported) -> None:
    import onnx

    _, path, info = exported
    proto = onnx.load(str(path))
    meta = {p.key: p.value for p in proto.metadata_props}
    assert meta["omnidraft.format_version"] == "1" and meta["omnidraft.bundle_hash"] == "h123"
    assert GraphInfo(**json.loads(meta["omnidraft.graph_info"])) == info
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == input_names(2)
    assert [o.name for o in sess.get_outputs()] == output_names(2)
    assert not path.with_name("target.onnx.data").exists()  # small graphs keep weights inline


def test_cache_outputs_are_the_eager_cache_entries(exported) -> None:
    model, path, info = exported
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    caches = {f"cache_{i}": np.zeros((1, 2, 32, 16), np.float32) for i in range(4)}
    ids = np.array([[5, 9, 100, 3]], np.int64)
    logits, *new = sess.run(None, {"token_ids": ids, "input_pos": np.arange(4), **caches})
    model.reset_cache()
    ref = model(torch.from_numpy(ids), torch.arange(4))
    np.testing.assert_allclose(logits, ref.detach().numpy(), atol=1e-5)
    for i, entries in enumerate(new):  # this chunk's k/v == what the stateful model stored
        np.testing.assert_allclose(entries, model.get_buffer(f"kv_cache_{i}")[:, :, :4], atol=1e-5)


def test_ort_mobile_format_matches(exported, tmp_path: Path) -> None:
    from omnidraft_deploy.exporters.onnx.graph import convert_to_ort

    model, path, info = exported
    copy = tmp_path / "target.onnx"
    copy.write_bytes(path.read_bytes())
    ort_path = convert_to_ort(copy)
    assert ort_path.suffix == ".ort" and not list(tmp_path.glob("*.config"))
    result = verify_artifact(ort_path, info, model, get_recipe("onnx", "fp32"), PROMPTS)
    assert result["max_abs_logit_diff"] < 1e-4


@pytest.mark.parametrize("quant", ["int8", "int8-dyn"])
def test_int8_recipes_are_smaller_and_within_tolerance(
    exported, tmp_path: Path, quant: str
) -> None:
    from omnidraft_deploy.exporters.onnx.graph import export_onnx

    model, path, info = exported
    q = tmp_path / "q.onnx"
    recipe = get_recipe("onnx", quant)
    export_onnx(model, q, info=dataclasses.replace(info, quantization=quant), recipe=recipe)
    assert q.stat().st_size < 0.6 * path.stat().st_size
    result = verify_artifact(q, info, model, recipe, PROMPTS)
    assert 0 < result["max_abs_logit_diff"] < recipe.tolerance


def test_verification_fails_loudly_for_a_different_model(exported) -> None:
    _, path, info = exported
    other = build_model(SPEC, seed=6, max_seq_len=32)  # same shapes, other weights
    with pytest.raises(ExportVerificationError, match=r"target.onnx: parity .* fp32"):
        verify_artifact(path, info, other, get_recipe("onnx", "fp32"), PROMPTS)


def test_ort_format_is_refused_past_two_gib(tmp_path: Path) -> None:
    """ORT's converter segfaults on >2 GiB graphs; we refuse before calling it (sparse files)."""
    from omnidraft_deploy.exporters.onnx.graph import convert_to_ort, ort_format_blocker

    graph = tmp_path / "target.onnx"
    graph.write_bytes(b"\0" * 1024)
    assert ort_format_blocker(graph) is None
    with (tmp_path / "target.onnx.data").open("wb") as f:
        f.truncate(2**31 + 1)  # sparse: no disk used
    assert "limited to 2 GiB" in (ort_format_blocker(graph) or "")
    with pytest.raises(ValueError, match=r"target.onnx: no ORT format file"):
        convert_to_ort(graph)


def test_int4_recipe_keeps_the_lm_head_at_8_bits(exported, tmp_path: Path) -> None:
    import onnx
    from omnidraft_deploy.exporters.onnx.file_quant import _lm_head_node
    from omnidraft_deploy.exporters.onnx.graph import export_onnx

    model, path, info = exported
    head = _lm_head_node(onnx.load(str(path)))
    assert head is not None
    q, recipe = tmp_path / "q4.onnx", get_recipe("onnx", "int4")
    export_onnx(model, q, info=dataclasses.replace(info, quantization="int4"), recipe=recipe)
    bits = {
        n.name: next(a.i for a in n.attribute if a.name == "bits")
        for n in onnx.load(str(q)).graph.node
        if n.op_type == "MatMulNBits"
    }
    assert bits.pop(f"{head}_Q8") == 8 and bits and set(bits.values()) == {4}
    result = verify_artifact(q, info, model, recipe, PROMPTS)
    assert 0 < result["max_abs_logit_diff"] < recipe.tolerance


# ---- fused contrib-op graphs (exporters.onnx.fused), the onnx backend's default --------------


@pytest.fixture(scope="module")
def fused(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, GraphInfo]]:
    from omnidraft_deploy.exporters.onnx.graph import export_onnx

    model = build_model(SPEC, seed=5, max_seq_len=32)
    out = {}
    for quant in ("fp32", "int8", "int4"):
        path = tmp_path_factory.mktemp(f"fused_{quant}") / "target.onnx"
        info = graph_info(model, SPEC, file=path.name, quantization=quant, seq_len=None)
        export_onnx(model, path, info=info, recipe=get_recipe("onnx", quant), fused=True)
        out[quant] = path, info
    return out


def test_fused_graph_uses_contrib_ops_and_shared_caches(fused) -> None:
    import onnx

    from omnidraft_deploy.bundle.graph_contract import CacheIO, cache_io_of

    path, _ = fused["int8"]
    proto = onnx.load(str(path))
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("GroupQueryAttention") == 2 and "SkipSimplifiedLayerNormalization" in ops
    assert "MatMul" not in ops and "Softmax" not in ops  # every weight matmul is MatMulNBits
    levels = {a.i for n in proto.graph.node if n.op_type == "MatMulNBits" for a in n.attribute
              if a.name == "accuracy_level"}  # fmt: skip
    assert levels == {4}  # int8 compute: the fast CPU kernel
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == input_names(2)
    assert cache_io_of([o.name for o in sess.get_outputs()]) is CacheIO.SHARED


def test_fused_int4_graph_keeps_the_lm_head_at_8_bits(fused) -> None:
    import onnx

    path, _ = fused["int4"]
    bits = {n.name: a.i for n in onnx.load(str(path)).graph.node if n.op_type == "MatMulNBits"
            for a in n.attribute if a.name == "bits"}  # fmt: skip
    head = [b for name, b in bits.items() if name == _node_writing(path, "lm_head/out")]
    assert head == [8] and set(bits.values()) <= {4, 8}  # the body's bits: the int4 plan


def _node_writing(path: Path, output: str) -> str:
    import onnx

    return next(n.name for n in onnx.load(str(path)).graph.node if output in n.output)


@pytest.mark.parametrize("quant", ["fp32", "int8", "int4"])
def test_fused_graph_matches_eager_incl_rollback(fused, quant: str) -> None:
    path, info = fused[quant]
    model = build_model(SPEC, seed=5, max_seq_len=32)
    recipe = get_recipe("onnx", quant)
    result = verify_artifact(path, info, model, recipe, PROMPTS)
    bound = 1e-4 if quant == "fp32" else recipe.tolerance
    assert result["max_abs_logit_diff"] < bound and result["rollback_max_abs_diff"] < bound
    assert result["speed_decode_tok_s"] > 0 and result["speed_verify_len"] == 5


def test_fused_graph_ort_format_matches(fused, tmp_path: Path) -> None:
    from omnidraft_deploy.exporters.onnx.graph import convert_to_ort

    path, info = fused["fp32"]
    copy = tmp_path / "target.onnx"
    copy.write_bytes(path.read_bytes())
    model = build_model(SPEC, seed=5, max_seq_len=32)
    result = verify_artifact(convert_to_ort(copy), info, model, get_recipe("onnx", "fp32"), PROMPTS)
    assert result["max_abs_logit_diff"] < 1e-4


@pytest.mark.parametrize("bits", [8, 4])
def test_block_quantiser_round_trips_within_half_a_step(bits: int) -> None:
    from omnidraft_deploy.exporters.quant.grids import quantize_blocks

    w = torch.randn(6, 70, generator=torch.Generator().manual_seed(0))  # 70: a padded last block
    q, scales, third = quantize_blocks(w, bits, 32)
    s = torch.from_numpy(scales).view(6, 3, 1)
    if bits == 8:
        deq = (torch.from_numpy(q).float() - 128.0) * s
    else:  # codes 0..15 on offset + step * code
        b = torch.from_numpy(q)
        vals = torch.stack([b & 15, b >> 4], -1).view(6, 3, 32).float()
        deq = vals * s + torch.from_numpy(third).view(6, 3, 1)
    deq = deq.view(6, 96)[:, :70]
    assert float(((deq - w).abs() / s.repeat_interleave(32, 1).view(6, 96)[:, :70]).max()) <= 0.5001


def test_fused_graph_with_tied_embeddings(tmp_path: Path) -> None:
    """Tied lm_head (SmolLM2, Qwen2.5-0.5B): one table in the file, MatMul on its Transpose."""
    import onnx
    from omnidraft_deploy.exporters.onnx.graph import export_onnx

    spec = dataclasses.replace(SPEC, tie_embeddings=True)
    model = build_model(spec, seed=7, max_seq_len=32)
    path = tmp_path / "target.onnx"
    info = graph_info(model, spec, file=path.name, quantization="fp32", seq_len=None)
    export_onnx(model, path, info=info, recipe=get_recipe("onnx", "fp32"), fused=True)
    tables = [i for i in onnx.load(str(path)).graph.initializer if i.dims[:1] == [384]]
    assert len(tables) == 1
    result = verify_artifact(path, info, model, get_recipe("onnx", "fp32"), PROMPTS)
    assert result["max_abs_logit_diff"] < 1e-4


def test_fused_graph_external_weights_match_inline(fused, tmp_path: Path) -> None:
    """Weights streamed to ``<name>.data`` while building (models past 2 GB) give the same graph."""
    from omnidraft_deploy.exporters.onnx.fused import build_graph, save_model

    from omnidraft_deploy.bundle.graph_contract import ExplicitCacheGraph
    from omnidraft_deploy.host.onnx_host import cpu_session

    model = build_model(SPEC, seed=5, max_seq_len=32)
    path, data_path = tmp_path / "target.onnx", tmp_path / "target.onnx.data"
    with open(data_path, "wb") as data, torch.no_grad():
        proto = build_graph(model, get_recipe("onnx", "int8"), data=data, location=data_path.name)
    save_model(proto, path)
    assert data_path.stat().st_size > 4 * path.stat().st_size
    inline, info = fused["int8"]
    ids, pos = np.array([PROMPTS[0]]), np.arange(len(PROMPTS[0]))
    a = ExplicitCacheGraph(cpu_session(path), info).run(ids, pos)
    b = ExplicitCacheGraph(cpu_session(inline), info).run(ids, pos)
    np.testing.assert_array_equal(a, b)


def test_fused_graph_carries_llama3_rope_scaling(tmp_path: Path) -> None:
    """Llama-3.x frequency scaling reaches the fused graph's cos/sin caches (parity vs the scaled
    eager model; the unscaled model differs, so the check can fail)."""
    from omnidraft_deploy.exporters.onnx.graph import export_onnx

    from omnidraft_deploy.reference.model import ModelArgs
    from omnidraft_deploy.reference.rope import RopeScaling

    plain = build_model(SPEC, seed=5, max_seq_len=32)
    scaling = RopeScaling(factor=8.0, original_max_position_embeddings=4)
    model = Transformer(dataclasses.replace(ModelArgs.from_spec(SPEC, 32), rope_scaling=scaling))
    model.load_state_dict(plain.state_dict())
    model.eval()
    path = tmp_path / "target.onnx"
    info = graph_info(model, SPEC, file=path.name, quantization="fp32", seq_len=None)
    export_onnx(model, path, info=info, recipe=get_recipe("onnx", "fp32"), fused=True)
    assert (
        verify_artifact(path, info, model, get_recipe("onnx", "fp32"), PROMPTS)[
            "max_abs_logit_diff"
        ]
        < 1e-4
    )
    with pytest.raises(ExportVerificationError):
        verify_artifact(path, info, plain, get_recipe("onnx", "fp32"), PROMPTS)
