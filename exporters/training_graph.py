"""Recipe: the drafter's hybrid-loss training step as on-device programs (drafter only).

Two artifacts from one fixed-shape batch (``B = 1, T = seq_len, k = topk``; row form of
``omnidraft_deploy.distill.losses.hybrid_loss_rows``, inputs named as ``align.BATCH_FIELDS``):

(a) ExecuTorch training ``.pte``: ``torch.export`` -> ``_export_forward_backward`` (joint graph:
    loss, gradients, parameters) -> replace ``aten.empty_permuted`` (SiLU backward; the portable
    runtime has no kernel for it) -> ``to_edge`` -> ``to_executorch``. Method ``forward(draft_ids,
    topk_draft_ids, topk_probs, dm_weight, next_draft_ids, ngram_weight, lam) -> loss``; run it with
    ``executorch.extension.training`` and step with ``get_sgd_optimizer`` (``run_pte_step``).
(b) Functional train-step ONNX: ``make_fx`` traces ``params -> params - lr * grad(L)`` into plain
    ATen ops, then ``torch.onnx.export(dynamo=True)``. Inputs ``lr, lam, <batch>, <param names>``,
    outputs ``loss, updated.<param names>``; runs on any ONNX Runtime (ORT training is deprecated).

Weights back into the inference graph, without re-export (ONNX path): the train step's
``updated.<name>`` outputs are swapped into the drafter's inference graph by
``omnidraft_deploy.bundle.weight_swap`` (``bind_weights``, ``swap_initializers``), the same swap
that loads a multi-target bundle's per-target adapted drafter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from omnidraft_deploy.bundle.atomic import write_bytes_atomic
from omnidraft_deploy.distill.align import BATCH_FIELDS
from omnidraft_deploy.distill.losses import hybrid_loss_rows
from omnidraft_deploy.reference.model import Transformer

FORMAT_VERSION = 1
PREFIX = "drafter."


@dataclass(frozen=True)
class TrainStepConfig:
    seq_len: int = 64  # T of the fixed-shape batch (drafter tokens)
    topk: int = 8  # target top-k kept per position

    def __post_init__(self) -> None:
        if self.seq_len < 2 or self.topk < 1:
            raise ValueError(f"need seq_len >= 2 and topk >= 1, got {self}")


class HybridTrainStep(nn.Module):
    """``forward(*batch, lam) -> (loss,)``; the drafter is the only parameter holder."""

    def __init__(self, drafter: Transformer) -> None:
        super().__init__()
        self.drafter = drafter

    def forward(self, *inputs: Tensor) -> tuple[Tensor]:
        ids, topk_ids, topk_probs, dm_w, next_ids, ng_w, lam = inputs
        logits = self.drafter.forward_train(ids)  # (1, T, V_d)
        return (hybrid_loss_rows(logits, topk_ids, topk_probs, dm_w, next_ids, ng_w, lam),)


def example_batch(cfg: TrainStepConfig, vocab_size: int, seed: int = 0) -> dict[str, Tensor]:
    """A valid random batch of the exported shapes (used for tracing and tests)."""
    g = torch.Generator().manual_seed(seed)
    t, k = cfg.seq_len, cfg.topk
    return {
        "draft_ids": torch.randint(0, vocab_size, (1, t), generator=g),
        "topk_draft_ids": torch.randint(0, vocab_size, (1, t, k), generator=g),
        "topk_probs": torch.softmax(torch.randn(1, t, k, generator=g), -1),
        "dm_weight": torch.full((1, t), 1.0 / t),
        "next_draft_ids": torch.randint(0, vocab_size, (1, t), generator=g),
        "ngram_weight": torch.full((1, t), 0.5 / t),
    }


def _batch_args(batch: dict[str, Tensor], lam: float) -> tuple[Tensor, ...]:
    return (*(batch[f] for f in BATCH_FIELDS), torch.tensor(lam, dtype=torch.float32))


def _replace_empty_permuted(gm: torch.fx.GraphModule) -> int:
    """Swap contiguous ``empty_permuted`` (no portable kernel) for ``full(size, 0)``."""
    n_done = 0
    for node in list(gm.graph.nodes):
        if node.target != torch.ops.aten.empty_permuted.default:
            continue
        size, perm = node.args[0], list(node.args[1])
        if perm != sorted(perm):
            raise RuntimeError(f"non-contiguous empty_permuted {perm} in {node.format_node()}")
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(
                torch.ops.aten.full.default, (size, 0.0), {"dtype": node.kwargs.get("dtype")}
            )
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        n_done += 1
    gm.graph.lint()
    gm.recompile()
    return n_done


def export_executorch_training(
    drafter: Transformer, cfg: TrainStepConfig, path: Path, *, lam: float = 0.5
) -> Path:
    """prepare -> export -> joint fwd/bwd -> fix ops -> lower (to_edge) -> serialize ``.pte``."""
    from executorch.exir import to_edge  # noqa: PLC0415
    from torch.export.experimental import _export_forward_backward  # noqa: PLC0415

    step = HybridTrainStep(drafter).train()
    args = _batch_args(example_batch(cfg, drafter.args.vocab_size), lam)
    ep = _export_forward_backward(torch.export.export(step, args, strict=False))
    _replace_empty_permuted(ep.graph_module)
    meta = {
        "get_seq_len": cfg.seq_len,
        "get_topk": cfg.topk,
        "get_format_version": FORMAT_VERSION,
        "get_vocab_size": drafter.args.vocab_size,
    }
    program = to_edge(ep, constant_methods=meta).to_executorch()
    write_bytes_atomic(Path(path), program.buffer)
    return Path(path)


def run_pte_step(
    module: Any, batch: dict[str, Tensor], *, lr: float, lam: float, optimizer: Any | None = None
) -> tuple[float, Any]:
    """One SGD step through a loaded training module; returns ``(loss, optimizer)``.

    ``module`` comes from ``executorch.extension.training._load_for_executorch_for_training``;
    its ``named_parameters()`` (prefixed ``drafter.``) alias the program's weights.
    """
    from executorch.extension.training import get_sgd_optimizer  # noqa: PLC0415

    (loss,) = module.forward_backward("forward", _batch_args(batch, lam))
    if optimizer is None:
        optimizer = get_sgd_optimizer(module.named_parameters(), lr, 0, 0, 0, False)
    optimizer.step(module.named_gradients())
    return float(loss), optimizer


def pte_state_dict(module: Any) -> dict[str, Tensor]:
    """Current weights of a training module, keyed like ``Transformer.state_dict()``."""
    return {k.removeprefix(PREFIX): v.clone() for k, v in module.named_parameters().items()}


def _functional_step(drafter: Transformer, names: list[str]) -> Any:
    step = HybridTrainStep(drafter)

    def train_step(lr: Tensor, *flat: Tensor) -> tuple[Tensor, ...]:
        batch, params = flat[: len(BATCH_FIELDS) + 1], flat[len(BATCH_FIELDS) + 1 :]

        def loss_fn(ps: tuple[Tensor, ...]) -> Tensor:
            weights = {PREFIX + n: p for n, p in zip(names, ps, strict=True)}
            return torch.func.functional_call(step, weights, batch, strict=False)[0]

        grads, loss = torch.func.grad_and_value(loss_fn)(tuple(params))
        return (loss, *(p - lr * g for p, g in zip(params, grads, strict=True)))

    return train_step


class _Traced(nn.Module):
    def __init__(self, gm: torch.fx.GraphModule) -> None:
        super().__init__()
        self.gm = gm

    def forward(self, *args: Tensor) -> tuple[Tensor, ...]:
        return tuple(self.gm(*args))


def export_onnx_train_step(drafter: Transformer, cfg: TrainStepConfig, path: Path) -> Path:
    """trace (make_fx: autograd -> plain ATen) -> export ONNX -> metadata -> serialize."""
    import onnx  # noqa: PLC0415
    from torch.fx.experimental.proxy_tensor import make_fx  # noqa: PLC0415

    names = [n for n, _ in drafter.named_parameters()]
    params = [p.detach().clone() for _, p in drafter.named_parameters()]
    args = (
        torch.tensor(0.0),
        *_batch_args(example_batch(cfg, drafter.args.vocab_size), 0.5),
        *params,
    )
    gm = make_fx(_functional_step(drafter, names), tracing_mode="real")(*args)
    tmp = Path(path).with_suffix(".tmp.onnx")
    torch.onnx.export(
        _Traced(gm),
        args,
        tmp,
        dynamo=True,
        external_data=False,
        input_names=["lr", *BATCH_FIELDS, "lam", *names],
        output_names=["loss", *(f"updated.{n}" for n in names)],
    )
    model = onnx.load(str(tmp))
    info = {"seq_len": cfg.seq_len, "topk": cfg.topk, "vocab_size": drafter.args.vocab_size}
    onnx.helper.set_model_props(
        model,
        {"omnidraft.train_step": json.dumps(info), "omnidraft.format_version": str(FORMAT_VERSION)},
    )
    write_bytes_atomic(Path(path), model.SerializeToString())
    tmp.unlink()
    return Path(path)


def run_onnx_step(
    session: Any, params: dict[str, Tensor], batch: dict[str, Tensor], *, lr: float, lam: float
) -> tuple[float, dict[str, Tensor]]:
    """One functional step on an ``onnxruntime.InferenceSession``: ``(loss, updated params)``."""
    feeds = {
        "lr": torch.tensor(lr, dtype=torch.float32),
        "lam": torch.tensor(lam),
        **batch,
        **params,
    }
    outs = session.run(None, {i.name: feeds[i.name].numpy() for i in session.get_inputs()})
    names = [o.name.removeprefix("updated.") for o in session.get_outputs()[1:]]
    return float(outs[0]), {n: torch.from_numpy(v) for n, v in zip(names, outs[1:], strict=True)}
