"""Exported training steps (ExecuTorch .pte, functional ONNX) == one PyTorch SGD step."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from omnidraft_deploy.exporters.training_graph import (
    HybridTrainStep,
    TrainStepConfig,
    example_batch,
    export_executorch_training,
    export_onnx_train_step,
    pte_state_dict,
    run_onnx_step,
    run_pte_step,
)

from omnidraft_deploy.bundle.weight_swap import bind_weights, param_aliases, swap_initializers
from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.reference.model import Transformer, build_model

CFG = TrainStepConfig(seq_len=12, topk=4)
LR, LAM = 0.5, 0.3


def _drafter() -> Transformer:
    # the drafter's family with a small vocabulary and one layer keeps the exports fast
    spec = dataclasses.replace(get_preset("tiny-llama-68m"), vocab_size=512, n_layers=1)
    return build_model(spec, seed=3, max_seq_len=CFG.seq_len).train()


def _torch_step(
    model: Transformer, batch: dict[str, torch.Tensor]
) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad()
    (loss,) = HybridTrainStep(model)(*batch.values(), torch.tensor(LAM))
    loss.backward()
    with torch.no_grad():
        new = {n: p - LR * p.grad for n, p in model.named_parameters()}
    return float(loss), new


def test_onnx_train_step_matches_torch_and_feeds_inference_graph(tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    model = _drafter()
    batch = example_batch(CFG, model.args.vocab_size, seed=1)
    ref_loss, ref_params = _torch_step(model, batch)
    path = export_onnx_train_step(model, CFG, tmp_path / "train_step.onnx")
    sess = ort.InferenceSession(str(path))
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    loss, new_params = run_onnx_step(sess, params, batch, lr=LR, lam=LAM)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert set(new_params) == set(ref_params)
    for n, p in ref_params.items():
        torch.testing.assert_close(new_params[n], p, atol=2e-6, rtol=1e-4)
    # a second step from the ONNX-updated weights keeps decreasing this batch's loss
    loss2, _ = run_onnx_step(sess, new_params, batch, lr=LR, lam=LAM)
    assert loss2 < loss

    # weights flow back into the bundle's drafter graph (exporters.onnx, swappable) without
    # re-export, and the runtime's OrtModel decodes with them
    from omnidraft_deploy.exporters.exportable import graph_info
    from omnidraft_deploy.exporters.onnx.graph import export_onnx
    from omnidraft_deploy.runtime.onnxruntime_model import OrtModel

    infer_path = tmp_path / "drafter.onnx"
    spec = dataclasses.replace(get_preset("tiny-llama-68m"), vocab_size=512, n_layers=1)
    info = graph_info(model, spec, file=infer_path.name, quantization="fp32", seq_len=None)
    export_onnx(model.eval(), infer_path, info=info, swappable=True)
    binding = bind_weights(onnx.load(str(infer_path)), list(new_params))
    swapped = tmp_path / "drafter.swapped.onnx"
    onnx.save(swap_initializers(onnx.load(str(infer_path)), binding, new_params), str(swapped))
    ids = batch["draft_ids"][0, :8]
    onnx_logits = OrtModel(swapped, info).forward(ids, 0)
    model.load_state_dict(ref_params, strict=False)
    with torch.no_grad():
        torch.testing.assert_close(
            onnx_logits, model.forward_train(ids[None])[0], atol=1e-4, rtol=1e-4
        )
    stale_logits = OrtModel(infer_path, info).forward(ids, 0)  # original weights: must differ
    assert float((stale_logits - onnx_logits).abs().max()) > 1e-3


def test_bind_weights_rejects_optimised_graph() -> None:
    onnx = pytest.importorskip("onnx")
    graph = onnx.helper.make_graph(
        [], "g", [], [], initializer=[onnx.numpy_helper.from_array(torch.zeros(2).numpy(), "val_3")]
    )
    with pytest.raises(ValueError, match="optimize=False"):
        bind_weights(onnx.helper.make_model(graph), ["lm_head.weight"])


@pytest.mark.slow  # ~11 s: executorch import + export + lowering
def test_executorch_training_step_matches_torch(tmp_path: Path) -> None:
    training = pytest.importorskip("executorch.extension.training")
    model = _drafter()
    batch = example_batch(CFG, model.args.vocab_size, seed=2)
    path = export_executorch_training(model, CFG, tmp_path / "train.pte", lam=LAM)
    module = training._load_for_executorch_for_training(str(path))
    ref_loss, ref_params = _torch_step(model, batch)
    loss, _ = run_pte_step(module, batch, lr=LR, lam=LAM)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    got = pte_state_dict(module)
    assert set(got) == set(ref_params)
    for n, p in ref_params.items():
        torch.testing.assert_close(got[n], p, atol=2e-6, rtol=1e-4)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="seq_len"):
        TrainStepConfig(seq_len=1)


def test_tied_drafter_weights_swap_into_its_graph(tmp_path: Path) -> None:
    """Tied embedding / lm_head: the graph keeps one initializer under one of the two names."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from omnidraft_deploy.exporters.exportable import graph_info
    from omnidraft_deploy.exporters.onnx.graph import export_onnx
    from omnidraft_deploy.runtime.onnxruntime_model import OrtModel

    spec = dataclasses.replace(
        get_preset("tiny-llama-68m"), vocab_size=512, n_layers=1, tie_embeddings=True
    )
    model = build_model(spec, seed=4, max_seq_len=16).eval()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    info = graph_info(model, spec, file="d.onnx", quantization="fp32", seq_len=None)
    path = export_onnx(model, tmp_path / "d.onnx", info=info, swappable=True)
    params = dict(model.named_parameters())
    with pytest.raises(ValueError, match="embed_tokens"):
        bind_weights(onnx.load(str(path)), list(params))  # without aliases the tie is missed
    binding = bind_weights(onnx.load(str(path)), list(params), param_aliases(model))
    assert len(binding) == len(params)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    swapped = tmp_path / "d.swapped.onnx"
    onnx.save(swap_initializers(onnx.load(str(path)), binding, params), str(swapped))
    ids = torch.tensor([1, 7, 300, 42, 9])
    with torch.no_grad():
        ref = model(ids[None], torch.arange(5))[0]
    torch.testing.assert_close(OrtModel(swapped, info).forward(ids, 0), ref, atol=1e-4, rtol=1e-4)
