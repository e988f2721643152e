"""Issue 26: a drafter whose embedding is padded past its tokenizer (every Qwen: 151936 rows for
151665 ids; the tiny Qwen2 twin: 152064) exports AND opens, and never drafts a padded row; an
export never publishes a bundle its opener refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omnidraft_deploy.bundle.manifest import BundleError


def test_padded_rows_are_never_drafted() -> None:
    from omnidraft_deploy.speculative.draft_len import FixedDraftLen
    from omnidraft_deploy.speculative.drafter import CrossVocabDrafter, Mode
    from omnidraft_deploy.testing import toy_pair
    from omnidraft_deploy.vocab.build import build_mapper

    d_tok, t_tok = toy_pair()
    mapper = build_mapper(d_tok, t_tok)
    v_d = mapper.draft_vocab_size

    class PaddedLM:  # a graph with 3 padded rows, each scoring far above every real token
        vocab_size, max_seq_len = v_d + 3, 64

        def forward(self, token_ids: torch.Tensor, start_pos: int) -> torch.Tensor:
            logits = torch.zeros(len(token_ids), v_d + 3)  # (T, V_graph)
            logits[:, 1] = 1.0
            logits[:, v_d:] = 50.0
            return logits

    for mode, temperature in ((Mode.GREEDY, 0.0), (Mode.EXACT, 1.0)):
        drafter = CrossVocabDrafter(PaddedLM(), mapper, FixedDraftLen(3), mode=mode,
                                    target_vocab=t_tok.vocab_size, temperature=temperature)  # fmt: skip
        drafter.reset([1, 2])
        drafts, q, rows = drafter.draft(torch.Generator().manual_seed(0))
        assert drafts and all(d < v_d for d in drafts)
        assert all(r.shape == (v_d,) for r in rows)


@pytest.fixture(scope="module")
def padded_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reproduction: ``omnidraft-export --target tiny-qwen2-7b --drafter tiny-qwen2-7b
    --backend onnx`` (a same-vocabulary pair whose drafter embedding is padded). It used to
    publish a bundle every open refused ("drafter 151665 ... must be equal")."""
    pytest.importorskip("onnxruntime")
    from omnidraft_deploy.cli.main import export_main

    out = tmp_path_factory.mktemp("padded") / "b"
    args = ["--target", "tiny-qwen2-7b", "--drafter", "tiny-qwen2-7b", "--backend", "onnx",
            "--out", str(out), "--max-seq-len", "32", "--draft-len", "3"]  # fmt: skip
    assert export_main(args) == 0
    return out


def test_padded_drafter_bundle_opens_and_validates(padded_bundle: Path) -> None:
    from omnidraft_deploy.runtime.bundle import open_bundle
    from omnidraft_deploy.runtime.validate import validate_bundle

    opened = open_bundle(padded_bundle)
    assert opened.manifest.graphs["drafter"].vocab_size == 152064
    assert opened.mapper.draft_vocab_size == 151665  # the tokenizer's ids
    report = validate_bundle(padded_bundle, max_new_tokens=4)
    assert report["passed"] and report["speculative_equal"] == report["prompts"]


def test_an_export_whose_bundle_the_opener_refuses_publishes_nothing(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    from omnidraft_deploy.exporters.bundle import ExportConfig
    from omnidraft_deploy.exporters.export import export_pair

    def refuse(staged: Path) -> None:
        assert (staged / "manifest.json").is_file()  # the whole bundle, staged
        raise BundleError(staged / "vocab_map.bin", "refused by the opener")

    out = tmp_path / "b"
    cfg = ExportConfig(target="tiny-llama3-8b", drafter="tiny-llama-68m", backend="onnx",
                       out_dir=out, max_seq_len=32, draft_len=3, verify=False)  # fmt: skip
    with pytest.raises(BundleError, match="refused by the opener"):
        export_pair(cfg, opener=refuse)
    assert not out.exists() and not list(tmp_path.iterdir())
