"""The rotated model (``reference.rotate``): the same logits in every call style, tied or not, the
caller's model untouched, and an outlier channel of the residual stream spread out."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.reference.model import build_model
from omnidraft_deploy.reference.rotate import orthogonal, rotated
from omnidraft_deploy.reference.sink import SinkModel

IDS = torch.tensor([[3, 9, 27, 81, 5, 6, 40]])


def _model(tie: bool):  # type: ignore[no-untyped-def]
    spec = dataclasses.replace(get_preset("tiny-qwen2-7b"), vocab_size=384, tie_embeddings=tie)
    model = build_model(spec, seed=5, max_seq_len=32).requires_grad_(False)
    gen = torch.Generator().manual_seed(1)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):  # folded into the linears: make them matter
            p.copy_(0.5 + torch.rand(p.shape, generator=gen))
    return model


def test_orthogonal_is_orthogonal_and_seeded() -> None:
    q = orthogonal(48, seed=3)
    torch.testing.assert_close(q @ q.T, torch.eye(48), atol=1e-5, rtol=0)
    torch.testing.assert_close(q, orthogonal(48, seed=3))
    assert not torch.allclose(q, orthogonal(48, seed=4))


@pytest.mark.parametrize("tie", [False, True])
def test_rotated_model_computes_the_same_logits(tie: bool) -> None:
    from omnidraft_deploy.exporters.exportable import empty_caches

    model = _model(tie)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    turned = rotated(model)
    ref = model.forward_train(IDS)
    torch.testing.assert_close(turned.forward_train(IDS), ref, atol=1e-4, rtol=1e-4)
    explicit = turned.forward_explicit(IDS, torch.arange(7), *empty_caches(turned))[0]
    torch.testing.assert_close(explicit, ref, atol=1e-4, rtol=1e-4)
    # the sinked copy (what the QNN graph traces) rebuilds the model from its args: a tied head
    # must come back untied, or the rotated head would be replaced by the rotated table
    sink_ref = SinkModel(model, 7).forward_train(IDS)
    torch.testing.assert_close(SinkModel(turned, 7).forward_train(IDS), sink_ref,
                               atol=1e-4, rtol=1e-4)  # fmt: skip
    assert not turned.args.tie_embeddings and model.args.tie_embeddings is tie
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k], atol=0, rtol=0)


def test_rotation_spreads_an_outlier_channel() -> None:
    model = _model(False)
    with torch.no_grad():  # one channel 100x the others on every token, as real LLMs have
        model.model.embed_tokens.weight[:, 5] *= 100.0
    ratio = []
    for m in (model, rotated(model)):
        x = m.model.embed_tokens(IDS)  # the residual stream entering layer 0
        ratio.append(float(x.abs().max() / x.pow(2).mean().sqrt()))
    assert ratio[1] < ratio[0] / 3  # range / rms: the uint16 step over an ordinary value
