"""Calibration data and graph preparation for static (QDQ) quantisation on the QNN HTP.

``StepReader`` runs each prompt through the fp32 graph in chunks of exactly T tokens, feeding the
KV caches it returns back in, so calibration sees the activation ranges of real decoding steps
(prefill chunks and cache contents alike), not random tensors. ``reciprocal_to_div`` rewrites
the fp32 graph before quantisation (the HTP's uint8 Reciprocal is inaccurate).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from omnidraft_deploy.bundle.graph_contract import ExplicitCacheGraph, contiguous_positions
from omnidraft_deploy.bundle.sections import GraphInfo


def calibration_prompts(tokenizer: str, limit: int = 64) -> list[list[int]]:
    """Token ids of real text held out from verification: the real-pair prompt set (math, code,
    chat, summarisation) minus every prompt of the shipped set that parity is measured on."""
    import json
    from importlib import resources

    from omnidraft_deploy.catalog.prompts import load_prompts
    from omnidraft_deploy.vocab.tokenizers import load_tokenizer

    data = resources.files("omnidraft_deploy").joinpath("data/real_pair_prompts.json")
    shipped = {p.text for p in load_prompts()}
    texts = [p["text"] for p in json.loads(data.read_text("utf-8")) if p["text"] not in shipped]
    tok = load_tokenizer(tokenizer)
    return [tok.encode(text)[:limit] for text in texts]


def calibration_ids(tokenizer: str, vocab_size: int, limit: int = 64) -> list[list[int]]:
    """``calibration_prompts`` as ids of a graph with ``vocab_size`` entries (``in_vocab``)."""
    return in_vocab(calibration_prompts(tokenizer, limit), vocab_size)


def in_vocab(prompts: list[list[int]], vocab_size: int) -> list[list[int]]:
    """``prompts`` as ids of a graph with ``vocab_size`` entries, empty ones dropped (test
    presets cut the vocabulary: ids are read modulo its size)."""
    return [[t % vocab_size for t in ids] for ids in prompts if ids]


def start_windows(prompts: list[list[int]], t: int, stride: int = 8) -> list[list[int]]:
    """``t``-token windows of ``prompts`` starting mid-text (offsets ``1, 1 + stride, ...``), each
    to be read as a prompt of its own: the first token of a prompt is where a sinked graph's
    massive activations reappear, and which token starts it decides how large they get.

    Qwen2.5-0.5B after its ``<|endoftext|>`` sink (``benchmarks/first_token.py``: eager fp32,
    residual-stream max |x| at the first token): the calibration prompts' first words 85 median,
    105 max; ' Leading', a shipped prompt's first word, 391; tokens of the held-out text read
    alone up to 538. Calibrated on prompt starts alone, the QDQ graph clipped ' Leading' (15 % of
    the o_proj / down_proj output channels of layers 2-3 out of range): logits 21.8 off.
    """
    return [ids[s : s + t] for ids in prompts for s in range(1, len(ids) - t + 1, stride)]


def input_stats(
    model: Any, prompts: list[list[int]], modules: dict[str, Any], fold: Callable[[Any, Any], Any]
) -> dict[str, tuple[Any, int]]:
    """Statistics of the inputs of ``modules`` (key -> module) over one eager forward per prompt:
    key -> (``fold`` of every call's input as ``(rows, features)``, rows seen). ``fold(acc, x)``
    gets ``acc`` None on the first call."""
    acc: dict[str, Any] = {}
    rows: dict[str, int] = {}

    def hook(key: str) -> Callable[..., None]:
        def record(_mod: Any, inputs: tuple[Any, ...], _out: Any) -> None:
            x = inputs[0].detach().reshape(-1, inputs[0].shape[-1])
            acc[key] = fold(acc.get(key), x)
            rows[key] = rows.get(key, 0) + x.shape[0]

        return record

    forward_prompts(model, prompts, [m.register_forward_hook(hook(k)) for k, m in modules.items()])
    return {key: (acc[key], rows[key]) for key in acc}


def forward_prompts(model: Any, prompts: list[list[int]], handles: list[Any]) -> None:
    """One eager forward of ``model`` per prompt (calibration statistics come from the forward
    hooks behind ``handles``), which are removed afterwards, errors included; torch runs one
    thread per free core (``host.threads``)."""
    import torch

    from omnidraft_deploy.host.threads import FreeCoreThreads

    try:
        with torch.no_grad(), FreeCoreThreads() as threads:
            for ids in prompts:
                threads.adjust()
                model(torch.tensor([ids]), torch.arange(len(ids)))
    finally:
        for h in handles:
            h.remove()


def step_feeds(
    fp32_path: Path, info: GraphInfo, prompts: list[list[int]]
) -> list[dict[str, np.ndarray]]:
    """Every input dict the static graph sees while reading ``prompts`` (fp32 ORT run, stepped
    by ``graph_contract.ExplicitCacheGraph``, as the runtime steps it); caches are snapshots."""
    from omnidraft_deploy.host.onnx_host import cpu_session

    assert info.seq_len is not None
    t = info.seq_len
    graph = ExplicitCacheGraph(cpu_session(fp32_path), info)
    feeds: list[dict[str, np.ndarray]] = []
    for ids in prompts:
        graph.reset()
        usable = ids[: (min(len(ids), info.max_seq_len) // t) * t]
        for s in range(0, len(usable), t):
            chunk, pos = np.array([usable[s : s + t]], np.int64), contiguous_positions(s, t)
            feeds.append(graph.feeds(chunk, pos))
            graph.run(chunk, pos)
    return feeds


def reciprocal_to_div(proto: Any) -> int:
    """Rewrite ``Mul(a, Reciprocal(b))`` as ``Div(a, b)`` in place; returns how many were changed.

    RMSNorm's ``x * rsqrt(ms + eps)`` exports as Sqrt -> Reciprocal -> Mul. The HTP's uint8
    Reciprocal is far off the QDQ reference (measured on a toy graph: |diff| 4.5 over a 6.1
    range), which wrecked the logits (top-1 vs eager 6 %); with Div the HTP graph reaches 78 %.
    """
    from onnx import helper

    nodes = list(proto.graph.node)
    recips = {n.output[0]: n for n in nodes if n.op_type == "Reciprocal"}
    users = [n for n in nodes if any(i in recips for i in n.input)]
    if not users or any(n.op_type != "Mul" for n in users):
        return 0
    out = []
    for n in nodes:
        if n.op_type == "Reciprocal":
            continue
        if n in users:
            r = 0 if n.input[0] in recips else 1
            a, b = n.input[1 - r], recips[n.input[r]].input[0]
            n = helper.make_node("Div", [a, b], list(n.output), name=f"{n.name}_div")
        out.append(n)
    del proto.graph.node[:]
    proto.graph.node.extend(out)
    return len(users)


class StepReader:
    """onnxruntime.quantization CalibrationDataReader over ``step_feeds``."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self._it: Any = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)

    def rewind(self) -> None:  # pragma: no cover - part of the reader protocol
        raise NotImplementedError
