"""Recipe: Transformer -> static-shape QDQ ONNX for ONNX Runtime's QNN execution provider (NPU).

Stages (each timed with its peak RSS in ``stages``): gptq -> trace -> calibrate -> quantize ->
htp_compile.

- The graph is the model conditioned on an attention sink (``reference.sink``): its K/V,
  computed in fp32, are graph constants in front of the host-held caches, so the first token's
  massive activations (24k in SmolLM2-135M's residual stream, 40x anything else) never reach
  the quantised graph. The sink is the BOS / EOS token and, where it halves the next token's
  peak activation (measured at export, ``choose_sink``), a second token such as a blank line:
  after Qwen2.5-0.5B's ``<|endoftext|>`` alone a prompt's first token still peaks at up to 534.
  RMSNorm is one ``LpNormalization`` (no uint16 ``x^2``).
- The residual stream is turned by a seeded orthogonal matrix folded into the weights
  (``reference.rotate``, QuaRot): the same function with its outlier channels spread, so the
  uint16 scales of the residual ``Add``s, norms and ``o_proj`` / ``down_proj`` outputs are finer.
- Weight matmuls are ``Gemm`` (``weights.matmuls_to_gemm``): ONNX Runtime's QNN quantiser
  gives MatMul weights one scale per tensor, Gemm one per output channel. The lm_head is constant
  vocabulary chunks concatenated in the graph (``lm_head``: traced, it was a Transpose of the
  table, quantised as a uint16 activation the HTP refused).
- gptq: 8-bit symmetric per-channel weights by GPTQ on held-out text (``weights``), codes
  pinned through the quantiser; calibrate: real prompts through the fp32 graph, then windows
  of them read from position 0 (ranges for first tokens' massive activations: ``calibration``);
  quantize: ``get_qnn_qdq_config`` + ``quantize``, uint16 (``qdq-a16w8``, default) or uint8
  (``qdq-u8``) activations in QDQ format, what the Hexagon HTP runs.
- The attention MatMuls (two activations) run in fp16 between Casts (``fp16``): the HTP's
  16 x 16-bit integer MatMul cost SmolLM2-135M's HTP run 5 points of top-1.
- htp_compile: the QNN HTP backend with CPU fallback disabled, so any operator the NPU cannot
  take fails here and is reported by name; the EPContext model written beside the graph
  (``context_path``: ``<stem>_ctx.onnx`` + its ``_qnn.bin`` context binary, what a phone loads
  without compiling) must hold nothing but EPContext nodes (100 % HTP placement). On x86
  ``onnxruntime-qnn`` simulates the HTP.

``float_residual_stream`` (opt-in, ``mixed``) is the earlier answer to the massive
activations (residual stream and RMSNorms in fp16; the simulated HTP does not finalize it).
There is no fp32 QNN recipe: the HTP runs integer (or fp16) graphs.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from pathlib import Path
from typing import Any, cast

from omnidraft_deploy.exporters.memory import stage
from omnidraft_deploy.exporters.onnx.graph import WEIGHTS_LIMIT, export_onnx, set_metadata
from omnidraft_deploy.exporters.qnn.fp16 import fp16_activation_matmuls
from omnidraft_deploy.exporters.qnn.lm_head import DEFAULT_MAX_COLS, split_lm_head
from omnidraft_deploy.exporters.qnn.mixed import float_residual
from omnidraft_deploy.exporters.qnn.weights import Grids, gptq_linears, matmuls_to_gemm, pin_grids
from omnidraft_deploy.exporters.quant.calibration import (
    StepReader,
    calibration_ids,
    in_vocab,
    reciprocal_to_div,
    start_windows,
    step_feeds,
)

from omnidraft_deploy.bundle.graph_contract import ExplicitCacheGraph, contiguous_positions
from omnidraft_deploy.bundle.sections import GraphInfo
from omnidraft_deploy.catalog.backends import QuantRecipe
from omnidraft_deploy.checks.parity import StepFn
from omnidraft_deploy.host.onnx_host import context_path, htp_session
from omnidraft_deploy.reference.model import Transformer
from omnidraft_deploy.reference.rotate import rotated
from omnidraft_deploy.reference.sink import SINK_KEY, SinkModel, choose_sink, format_sink

log = logging.getLogger(__name__)
ROTATION_SEED = 0  # of the residual-stream rotation (recorded in the export's extras)


def export_qnn(
    model: Transformer,
    path: Path,
    *,
    info: GraphInfo,
    recipe: QuantRecipe,
    validate: bool = True,
    prompts: list[list[int]] | None = None,
    float_residual_stream: bool = False,
    sink: bool = True,
    gptq: bool = True,
    rotate: bool = True,
) -> dict[str, Any]:
    """Write the static-T (QDQ) graph to ``path``; returns calibration / HTP facts.

    ``prompts``: calibration token ids; None -> held-out real text through ``info.tokenizer``.
    ``float_residual_stream``: leave the residual stream and RMSNorms unquantised (``mixed``).
    ``sink``: the graph is the model conditioned on a sink token whose K/V are constants, and its
    RMSNorms are LpNormalization (``reference.sink``). ``gptq`` (with ``sink``: on the sinked copy, never
    the caller's model): 8-bit weights by GPTQ, pinned through the quantiser (``weights``).
    ``rotate``: the residual stream turned by ``orthogonal(dim, ROTATION_SEED)`` (``reference.rotate``;
    a copy: the caller's model is not changed).
    ``info.decode_file``: also write the T = 1 twin there (``GraphInfo.decode_info``; same
    weights and sink, calibrated on the same text one token at a time; its facts under
    ``decode``): one-token calls (drafting) then cost one token, not a padded T-token call.
    """
    extras: dict[str, Any] = {"seq_len": info.seq_len, "stages": {}}
    vocab = model.args.vocab_size
    calib = calibration_ids(info.tokenizer, vocab) if prompts is None else in_vocab(prompts, vocab)
    src, sink_ids, grids = (rotated(model, ROTATION_SEED) if rotate else model), None, None
    extras["rotation_seed"] = ROTATION_SEED if rotate else None
    if sink:
        with stage(extras["stages"], "sink"):
            sink_ids, peaks = choose_sink(model, info.tokenizer, calib)
        sinked_model = SinkModel(src, sink_ids, lp_norm=True)
        if gptq:
            with stage(extras["stages"], "gptq"):
                grids = gptq_linears(sinked_model, calib)
        sinked_model.set_export(True)
        src = cast(Transformer, sinked_model)
        extras["sink_tokens"] = list(sink_ids)
        extras["sink_first_token_peaks"] = {k: round(v, 1) for k, v in peaks.items()}
    graph = _QdqGraph(src, recipe, calib, grids, sink_ids, float_residual_stream, validate)
    extras |= graph.write(path, info, extras["stages"])
    if info.decode_file is not None:
        extras["decode"] = {"seq_len": 1, "stages": {}}
        one = path.with_name(info.decode_file)
        extras["decode"] |= graph.write(one, info.decode_info(), extras["decode"]["stages"])
    return extras


@dataclasses.dataclass(frozen=True)
class _QdqGraph:
    """What both graphs of one model share: the (sinked) model, recipe, text, GPTQ grids."""

    src: Transformer
    recipe: QuantRecipe
    calib: list[list[int]]
    grids: Grids | None
    sink: tuple[int, ...] | None
    float_residual_stream: bool
    validate: bool

    def write(self, path: Path, info: GraphInfo, stages: dict[str, Any]) -> dict[str, Any]:
        """trace -> calibrate -> quantize (-> htp_compile) of the graph at ``info.seq_len``."""
        import onnx
        from onnxruntime.quantization import QuantType, quantize
        from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

        extras: dict[str, Any] = {}
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            with stage(stages, "trace"):
                fp32 = export_onnx(
                    self.src, Path(tmp) / "fp32.onnx", info=info, seq_len=info.seq_len
                )
            graph = onnx.load(str(fp32))
            # 16-bit QDQ; ORT's own upgrade serialises the model (< 2 GiB)
            _opset_at_least(graph, 21)
            extras["reciprocal_to_div"] = reciprocal_to_div(graph)
            extras["lm_head_chunks"] = split_lm_head(graph, DEFAULT_MAX_COLS)
            # residual stream + RMSNorm in fp16: top-1 0.041 -> 0.891 on SmolLM2 (CPU run of the QDQ
            # graph), but the HTP then fails to finalize the real graph (MEM_ALLOC): opt-in, open
            keep_float = float_residual(graph) if self.float_residual_stream else []
            # per-channel weights (weights); the opt-in float graph keeps its MatMul names
            extras["gemm_weights"] = 0 if self.float_residual_stream else matmuls_to_gemm(graph)
            extras["float_nodes"] = len(keep_float)
            # a new file (the trace's data stays); Qwen2.5-0.5B: external data from here on
            fp32, big = save_onnx(graph, Path(tmp) / "graph.onnx")
            del graph  # (saving moved its weights out); reloaded for pin_grids
            windows = start_windows(self.calib, info.seq_len or 1)  # read from position 0
            with stage(stages, "calibrate"):
                feeds = step_feeds(fp32, info, self.calib + windows)
            extras["calibration_steps"], extras["calibration_windows"] = len(feeds), len(windows)
            a16 = self.recipe.activation_bits == 16
            config = get_qnn_qdq_config(
                str(fp32),
                StepReader(feeds),
                activation_type=QuantType.QUInt16 if a16 else QuantType.QUInt8,
                weight_type=QuantType.QUInt8,
                per_channel=True,
                nodes_to_exclude=keep_float,
            )
            # ORT's "CalibMaxIntermediateOutputs" (merge ranges every N steps, "same result, less
            # memory") is not the same result here: the tiny llama-68m twin fell from top-1 0.988 to
            # 0.43 with N = 16. Calibration keeps every step's outputs (SmolLM2-135M: 11.6 GB peak).
            config.use_external_data_format = big
            qdq = Path(tmp) / "qdq.onnx"
            with stage(stages, "quantize"):
                quantize(str(fp32), str(qdq), config)
            proto = onnx.load(str(qdq))
            if self.grids:
                extras["gptq_channels"] = pin_grids(proto, onnx.load(str(fp32)), self.grids)
            extras["fp16_matmuls"] = fp16_activation_matmuls(proto)  # Q K^T, P V: not 16 x 16-bit
            set_metadata(proto, info)
            if self.sink is not None:
                proto.metadata_props.add(key=SINK_KEY, value=format_sink(self.sink))
            if _initializer_bytes(proto) > WEIGHTS_LIMIT:
                raise ValueError(f"{path.name}: the QDQ graph holds over 2 GiB of weights; the QNN "
                                 "backend writes one self-contained graph")  # fmt: skip
            onnx.save(proto, str(path))
        if self.validate:  # compile for the HTP once; the EPContext model is what a phone loads
            with stage(stages, "htp_compile"):
                ctx = context_path(path)
                session = htp_session(path, context=ctx)
                files = [ctx, *ctx.parent.glob(f"{ctx.stem}_*.bin")]  # the QNN context binary
                extras["htp_context_files"] = sorted(f.name for f in files)
                extras["htp_context_bytes"] = sum(f.stat().st_size for f in files)
                extras["htp_cpu_nodes"] = nodes_outside_htp(ctx)
            extras["htp_providers"] = session.get_providers()
            extras["htp_validated"] = True
        return extras


def _opset_at_least(proto: Any, version: int) -> None:
    """Raise the default-domain opset to ``version`` in place (opsets 20 -> 21 only widen types
    of the ops these graphs use: uint16 / int4 for Q/DQ, Cast, Reshape, Transpose, ...)."""
    for opset in proto.opset_import:
        if opset.domain in ("", "ai.onnx") and opset.version < version:
            opset.version = version


def _initializer_bytes(proto: Any) -> int:
    return sum(len(t.raw_data) for t in proto.graph.initializer)


def save_onnx(proto: Any, path: Path) -> tuple[Path, bool]:
    """``proto`` to ``path``, its weights in ``<name>.data`` beside it past 2 GiB (the traced fp32
    graph of Qwen2.5-0.5B with its lm_head chunks is ~3 GB; ``onnx.save`` then moves the weights
    out of ``proto`` itself); returns the path and whether the weights went out."""
    import onnx

    big = _initializer_bytes(proto) > WEIGHTS_LIMIT
    onnx.save(proto, str(path), save_as_external_data=big,
              location=f"{path.name}.data" if big else None)  # fmt: skip
    return path, big


def nodes_outside_htp(context: Path) -> list[str]:
    """``"OpType (name)"`` of every node of an EPContext dump that is not an HTP context binary:
    empty means the whole graph runs on the HTP (CPU fallback was disabled, so it must be)."""
    import onnx

    graph = onnx.load(str(context), load_external_data=False).graph
    return [f"{n.op_type} ({n.name})" for n in graph.node if n.op_type != "EPContext"]


def htp_step(path: Path, info: GraphInfo) -> StepFn:
    """A ``parity.StepFn`` running ``path`` on the (simulated) HTP, CPU fallback disabled: what
    the NPU computes in integers, where ``verify.artifact_step`` runs the QDQ graph in float."""
    import torch

    graph = ExplicitCacheGraph(htp_session(path), info)

    def step(token_ids: torch.Tensor, start_pos: int) -> torch.Tensor:
        pos = contiguous_positions(start_pos, len(token_ids))
        return torch.from_numpy(graph.run(token_ids.numpy()[None], pos))

    return step
