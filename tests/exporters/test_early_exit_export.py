"""A layer-truncated (early-exit) drafter exports like any model: ONNX fp32 and weight-only int8
graphs match eager PyTorch (incl. KV rollback), and greedy speculative decoding with it, eager or
through the exported graph, equals target-only decoding."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from omnidraft_deploy.exporters.exportable import graph_info
from omnidraft_deploy.exporters.verify import verify_artifact

from omnidraft_deploy.catalog.backends import get_recipe
from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.ngram.cache import NGramCache
from omnidraft_deploy.reference.model import Transformer, build_model
from omnidraft_deploy.reference.torch_lm import EagerLM
from omnidraft_deploy.reference.truncate import truncate_layers
from omnidraft_deploy.speculative.decoder import (
    DecodeConfig,
    SpeculativeDecoder,
    generate_target_only,
)
from omnidraft_deploy.speculative.draft_len import FixedDraftLen
from omnidraft_deploy.testing import toy_pair, toy_spec
from omnidraft_deploy.vocab.mapper import VocabMapper

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

# tiny twin of the early-exit SmolLM2 drafter: Llama block, GQA, tied embeddings; 4 -> 2 layers
PARENT = dataclasses.replace(get_preset("tiny-llama-68m"), n_layers=4, n_kv_heads=2,
                             vocab_size=384, tie_embeddings=True)  # fmt: skip
CHILD = dataclasses.replace(PARENT, n_layers=2)
PROMPTS = [[5, 9, 100, 3, 44, 17], [7, 8]]


@pytest.fixture(scope="module")
def child() -> Transformer:
    return truncate_layers(build_model(PARENT, seed=4, max_seq_len=32), 2)


@pytest.mark.parametrize("quant", ["fp32", "int8"])
def test_truncated_drafter_export_matches_eager(
    child: Transformer, tmp_path: Path, quant: str
) -> None:
    from omnidraft_deploy.exporters.onnx.graph import export_onnx

    path = tmp_path / "drafter.onnx"
    info = graph_info(child, CHILD, file=path.name, quantization=quant, seq_len=None)
    recipe = get_recipe("onnx", quant)
    export_onnx(child, path, info=info, recipe=recipe)
    result = verify_artifact(path, info, child, recipe, PROMPTS)
    bound = 1e-4 if quant == "fp32" else recipe.tolerance
    assert result["max_abs_logit_diff"] < bound and result["rollback_max_abs_diff"] < bound
    assert result["top1_agreement"] >= recipe.min_top1
    assert info.n_layers == 2


def test_greedy_speculation_with_a_truncated_drafter_equals_target_only() -> None:
    dt, tt = toy_pair()
    mapper = VocabMapper.from_tokenizers(dt, tt)
    target = EagerLM(build_model(toy_spec(tt.vocab_size), seed=1, init_std=0.5))
    deep = build_model(dataclasses.replace(toy_spec(dt.vocab_size), n_layers=3), seed=2,
                       init_std=0.5)  # fmt: skip
    drafter = EagerLM(truncate_layers(deep, 1))
    cfg = DecodeConfig(max_new_tokens=40)
    dec = SpeculativeDecoder(target, drafter, mapper, FixedDraftLen(4), NGramCache(), config=cfg)
    proposed = 0
    for prompt in ("ab ca", "c", " abc abc", "bbbb"):
        ids = tt.encode(prompt)
        ref, _ = generate_target_only(target, ids, cfg)
        out, st = dec.generate(ids)
        assert out == ref
        proposed += st.proposed
    assert proposed > 0  # the drafter did propose: the equality is not trivial
