"""Recipe: Transformer -> ONNX graph of ONNX Runtime's fused contrib ops (the ``onnx`` backend).

Written node by node from the weights (no tracing: seconds, not minutes), the layout ONNX Runtime
GenAI's model builder emits for Llama / Qwen2 on CPU:

- ``SimplifiedLayerNormalization`` / ``SkipSimplifiedLayerNormalization`` (RMSNorm + residual);
- one packed q|k|v projection feeding ``GroupQueryAttention`` with ``do_rotary`` (HF rotate-half
  RoPE from cos/sin caches) and past/present KV buffers of ``max_seq_len`` slots;
- weight matmuls as ``MatMul`` (fp32) or ``MatMulNBits`` (int8 symmetric / int4 asymmetric, blocks
  of ``group_size`` along the input dimension, ``accuracy_level=4``: int8 compute, ~24x faster
  than fp32 compute for 8-bit weights here); gate|up packed into one matmul. int4 keeps a float
  offset per block (GGUF Q4_1's grid, exact for weights published in it): MatMulNBits' own zero
  points are integers, and its float zero points run 40x slower here (fp32 dequantisation per
  call), so the offsets are a per-row block sum times an ``(n_blocks, N)`` table, added after;
- or, recipe ``w8a8``, ``MatMulInteger`` on int8 weights (one scale per output column, zero
  point 0: see ``GraphWriter.linear_rows``) and int8 activations with one scale per row:
  ONNX Runtime's integer GEMM instead of MatMulNBits' blockwise kernel. Measured here (2 threads,
  ``benchmarks/matmul_kernels.py``, reports/matmul_kernels.json): Qwen2.5's lm_head 896x151936
  takes 4.6 / 4.8 / 5.8 ms for T = 1 / 2 / 8 rows against MatMulNBits' 6.6 / 8.2 / 13.6, so
  verification width gets cheap. The coarser activation scale needs SmoothQuant
  (``exporters.quant.smoothquant``), applied by the exporter before the graph is written.

Cache contract (``omnidraft_deploy.bundle.graph_contract``, ``CacheIO.SHARED``): inputs ``token_ids``,
``input_pos`` (contiguous positions; ``seqlens_k = input_pos[-1]``, ``total_sequence_length =
input_pos[-1] + 1``), ``cache_i`` and the optional ``logits_from`` (default 0: logits of rows
``logits_from ..`` only); outputs ``logits`` and ``present_i``, which the host binds
to the same buffer as ``cache_i``, so GroupQueryAttention writes this chunk's k/v in place at
``input_pos`` and attends to slots ``<= input_pos``. Rollback is calling again at an earlier
position: stale slots past it are outside ``total_sequence_length`` and then overwritten.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from omnidraft_deploy.exporters.onnx import invariant as onnx_invariant
from omnidraft_deploy.exporters.onnx.gguf_grid import grid_embedding, grid_linear
from omnidraft_deploy.exporters.quant.gguf_grid import Grid
from omnidraft_deploy.exporters.quant.grids import per_row_int8, quantize_blocks
from omnidraft_deploy.exporters.quant.int4_plan import fused_linears
from torch import Tensor

from omnidraft_deploy.bundle import graph_contract as gc
from omnidraft_deploy.catalog.backends import Activations, QuantRecipe
from omnidraft_deploy.reference.model import DecoderLayer, Transformer

MS = "com.microsoft"
ACCURACY_LEVEL = 4  # MatMulNBits: int8 activations x int8/int4 weights (fp32 accumulate)


class GraphWriter:
    """Nodes + initializers of one graph; ``bits`` 0 = fp32 matmuls, 8 / 4 = MatMulNBits.

    Initializers are added in place to ``model`` (no protobuf copies of the weights); with
    ``data`` (an open binary file) their bytes go straight to that external-data file instead,
    named ``location`` in the graph, 4 KiB-aligned (a >2 GB model never exists as one message).
    """

    def __init__(self, bits: int, block: int, *, data: BinaryIO | None = None, location: str = "",
                 act_rows: bool = False, plan: dict[str, int] | None = None,
                 grids: dict[str, list[Grid]] | None = None,
                 outliers: dict[str, np.ndarray] | None = None) -> None:  # fmt: skip
        from onnx import ModelProto, helper

        self.helper, self.model = helper, ModelProto()
        self.bits, self.block, self.act_rows = bits, block, act_rows
        # matmul name -> bits where not the graph's (``exporters.quant.int4_plan``)
        self.plan = plan or {}
        self.grids = grids or {}  # name -> its parts on their GGUF grids (``onnx.gguf_grid``)
        self.outliers = outliers or {}  # grid matmul name -> input channels split out of it
        self._shared: set[str] = set()
        self.data, self.location = data, location
        self.nodes: list[Any] = []

    def const(self, name: str, value: np.ndarray | Tensor) -> str:
        arr = value.detach().float().numpy() if isinstance(value, Tensor) else value
        arr = np.ascontiguousarray(arr)
        t = self.model.graph.initializer.add()
        t.name, t.data_type = name, self.helper.np_dtype_to_tensor_dtype(arr.dtype)
        t.dims.extend(arr.shape)
        if self.data is None or arr.nbytes < 1024:
            t.raw_data = arr.tobytes()
            return name
        offset = -(-self.data.tell() // 4096) * 4096
        self.data.seek(offset)
        self.data.write(arr.data.cast("B"))
        t.data_location = t.EXTERNAL
        for key, val in (("location", self.location), ("offset", offset), ("length", arr.nbytes)):
            t.external_data.add(key=key, value=str(val))
        return name

    def shared(self, name: str, value: np.ndarray) -> str:
        """A small graph-wide constant, added on first use."""
        if name not in self._shared:
            self._shared.add(name)
            self.const(name, value)
        return name

    def node(self, op: str, inputs: list[str], outputs: list[str], **attrs: Any) -> list[str]:
        domain = MS if op in _CONTRIB else ""
        name = f"{op}_{len(self.nodes)}"
        self.nodes.append(
            self.helper.make_node(op, inputs, outputs, name=name, domain=domain, **attrs)
        )
        return outputs

    def linear(
        self, name: str, x: str, w: Tensor, bias: Tensor | None = None, *, bits: int | None = None
    ) -> str:
        """``x (1, T, K) @ w.T (+ bias)``: ``w (N, K)`` as MatMul or MatMulNBits (``bits``: this
        matmul's width when not the graph's or the plan's)."""
        out = f"{name}/out"
        n, k = w.shape
        bits = self.plan.get(name, self.bits) if bits is None else bits
        if name in self.grids:
            out = grid_linear(self, name, x, self.grids[name], self.outliers.get(name))
        elif bits == 8 and self.act_rows:
            out = self.linear_rows(name, x, w)
        elif bits == 0:
            self.node("MatMul", [x, self.const(f"{name}.weight_t", w.T.contiguous())], [out])
        else:
            q, scales, offsets = quantize_blocks(w.detach(), bits, self.block)
            ins = [x, self.const(f"{name}.qweight", q), self.const(f"{name}.scales", scales)]
            centred = out if bits == 8 else f"{name}/centred"
            self.node(
                "MatMulNBits", ins, [centred], K=k, N=n, bits=bits, block_size=self.block,
                accuracy_level=ACCURACY_LEVEL,
            )  # fmt: skip
            if bits == 4:
                corr = self.block_offsets(name, x, k, offsets + 8 * scales.reshape(offsets.shape))
                self.node("Add", [centred, corr], [out])
        if bias is None:
            return out
        self.node("Add", [out, self.const(f"{name}.bias", bias)], [f"{name}/biased"])
        return f"{name}/biased"

    def block_offsets(self, name: str, x: str, k: int, offsets: np.ndarray) -> str:
        """``sum over blocks b of (sum of x over block b) * offsets[:, b]``: the float offsets of
        an int4 grid, ``x (1, T, K)``, ``offsets (N, n_blocks)``. Every row is its own (a reduce
        and a small fp32 MatMul over ``n_blocks``), so the graph stays batch-invariant."""
        n_blocks = offsets.shape[1]
        p = f"{name}/blocks"
        if k % self.block:  # zero-pad the inputs of the last block (not the case for real LLMs)
            pads = np.array([0, 0, 0, 0, 0, n_blocks * self.block - k], np.int64)
            self.node("Pad", [x, self.const(f"{p}/pads", pads)], [f"{p}/padded"])
            x = f"{p}/padded"
        shape = np.array([1, -1, n_blocks, self.block], np.int64)
        self.node("Reshape", [x, self.shared(f"blocks/shape{n_blocks}", shape)], [f"{p}/split"])
        last = self.shared("rows/last_axis", np.array([-1], np.int64))
        self.node("ReduceSum", [f"{p}/split", last], [f"{p}/sums"], keepdims=0)
        table = self.const(f"{name}.block_offsets", np.ascontiguousarray(offsets.T, np.float32))
        self.node("MatMul", [f"{p}/sums", table], [f"{p}/out"])
        return f"{p}/out"

    def linear_rows(self, name: str, x: str, w: Tensor) -> str:
        """``x @ w.T`` as ``MatMulInteger``: ``w`` int8 symmetric per output column; each row of
        ``x`` quantised symmetric int8 with its own scale (``max|row| / 127``), stored as uint8
        with zero point 128 (ONNX Runtime's MatMulInteger takes one activation zero point).
        Integer products are exact and every row's arithmetic is its own: batch-invariant.

        The weights are int8 with no zero point input (0: u8 x s8; one zero point initializer
        shared by every node made ONNX Runtime refuse the graph under ``EXACT_U8S8``). On x86
        CPUs with VNNI, ONNX Runtime runs that product with ``vpdpbusd`` (int32 sums): exact, and
        on a Zen 5 EPYC the 1.5B target's 1-token call took 37.7 ms against 50.0 ms for the u8 x
        u8 form this graph used to store (``q + 128``, zero point 128), 9 tokens 65.6 against
        98.9 ms, a prefill 2.7 against 5.1 ms a token, with bitwise the same logits
        (``docs/results/decoding.md``). On x86 without VNNI the u8 x s8 kernel sums pairs of
        products in int16 with saturation (``vpmaddubsw``): every output of a 1536-deep product
        was wrong on an AVX2 EPYC and the Qwen2.5-Coder-1.5B graph read top-1 0.878 against eager
        (``benchmarks/w8a8_saturation``), so every session opened there asks for ONNX Runtime's
        exact kernel (``host.onnx_host.cpu_session``, ``EXACT_U8S8``)."""
        wq, w_scale = per_row_int8(w.detach().float())  # (N, K), (N,)
        w8 = wq.T.to(torch.int8).contiguous().numpy()  # (K, N) int8
        f32 = np.float32
        inv127 = self.shared("rows/inv127", np.array(1 / 127, f32))
        c128 = self.shared("rows/c128", np.array(128, f32))
        eps = self.shared("rows/eps", np.array(1e-10, f32))
        zp = self.shared("rows/zp", np.array(128, np.uint8))
        last = self.shared("rows/last_axis", np.array([-1], np.int64))
        p = f"{name}/rows"
        self.node("Abs", [x], [f"{p}/abs"])
        self.node("ReduceMax", [f"{p}/abs", last], [f"{p}/amax"], keepdims=1)
        self.node("Mul", [f"{p}/amax", inv127], [f"{p}/scale0"])
        self.node("Max", [f"{p}/scale0", eps], [f"{p}/scale"])  # an all-zero row stays zero
        self.node("Div", [x, f"{p}/scale"], [f"{p}/scaled"])
        self.node("Round", [f"{p}/scaled"], [f"{p}/rounded"])
        self.node("Add", [f"{p}/rounded", c128], [f"{p}/shifted"])
        self.node("Cast", [f"{p}/shifted"], [f"{p}/xq"], to=2)  # uint8; |x/scale| <= 127
        self.node(
            "MatMulInteger",
            [f"{p}/xq", self.const(f"{name}.qweight", w8), zp],  # weight zero point: 0
            [f"{p}/acc"],
        )
        self.node("Cast", [f"{p}/acc"], [f"{p}/accf"], to=1)
        self.node("Mul", [f"{p}/accf", f"{p}/scale"], [f"{p}/row_scaled"])
        self.node(
            "Mul",
            [f"{p}/row_scaled", self.const(f"{name}.wscale", w_scale.numpy())],
            [f"{name}/out"],
        )
        return f"{name}/out"


_CONTRIB = {
    "MatMulNBits",
    "RotaryEmbedding",
    "GroupQueryAttention",
    "SkipSimplifiedLayerNormalization",
}


def _positions(g: GraphWriter) -> tuple[str, str]:
    """``seqlens_k (1,) int32 = input_pos[-1]`` and ``total_sequence_length () int32 = +1``."""
    g.node("Gather", [gc.INPUT_POS, g.const("pos/last_idx", np.array(-1, np.int64))], ["pos/last"])
    g.node("Cast", ["pos/last"], ["pos/last32"], to=6)
    g.node("Unsqueeze", ["pos/last32", g.const("pos/axes", np.array([0], np.int64))], ["seqlens_k"])
    g.node("Add", ["pos/last32", g.const("pos/one", np.array(1, np.int32))], ["total_seq_len"])
    return "seqlens_k", "total_seq_len"


def _layer(model: Transformer, i: int) -> DecoderLayer:
    layer = model.model.layers[i]
    assert isinstance(layer, DecoderLayer)
    return layer


def _attention(
    g: GraphWriter, model: Transformer, i: int, h: str, pos: tuple[str, str] | None
) -> str:
    """One layer's attention; ``pos`` None: the batch-invariant plain-op form (``invariant``)."""
    a, attn = model.args, _layer(model, i).self_attn
    w = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
    biases = [attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]
    b = None if any(x is None for x in biases) else torch.cat(biases)  # type: ignore[arg-type]
    qkv = g.linear(f"layers.{i}.qkv_proj", h, w, b)
    out = f"layers.{i}.attn/out"
    if pos is None:
        out = onnx_invariant.attention(g, qkv, i, n_heads=a.n_heads, n_kv_heads=a.n_kv_heads)
        return g.linear(f"layers.{i}.o_proj", out, attn.o_proj.weight)
    g.node(
        "GroupQueryAttention",
        [qkv, "", "", gc.cache_in(2 * i), gc.cache_in(2 * i + 1), *pos, "cos_cache", "sin_cache"],
        [out, gc.cache_present(2 * i), gc.cache_present(2 * i + 1)],
        num_heads=a.n_heads, kv_num_heads=a.n_kv_heads, do_rotary=1, rotary_interleaved=0,
    )  # fmt: skip
    return g.linear(f"layers.{i}.o_proj", out, attn.o_proj.weight)


def _mlp(g: GraphWriter, model: Transformer, i: int, h: str) -> str:
    mlp = _layer(model, i).mlp
    gu = g.linear(f"layers.{i}.gate_up", h, torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
    p = f"layers.{i}.mlp"
    g.node("Split", [gu], [f"{p}/gate", f"{p}/up"], axis=-1, num_outputs=2)
    g.node("Sigmoid", [f"{p}/gate"], [f"{p}/sig"])
    g.node("Mul", [f"{p}/gate", f"{p}/sig"], [f"{p}/silu"])
    g.node("Mul", [f"{p}/silu", f"{p}/up"], [f"{p}/act"])
    return g.linear(f"layers.{i}.down_proj", f"{p}/act", mlp.down_proj.weight)


def _norm(g: GraphWriter, x: str, skip: str | None, weight: Tensor, name: str, eps: float) -> str:
    """RMSNorm of ``x`` (+ ``skip``): returns the normed name; the sum is ``name/sum``."""
    w = g.const(f"{name}.weight", weight)
    if skip is None:
        g.node("SimplifiedLayerNormalization", [x, w], [f"{name}/out"], epsilon=eps, axis=-1)
        g.node("Identity", [x], [f"{name}/sum"])
    else:
        outs = [f"{name}/out", "", "", f"{name}/sum"]
        g.node("SkipSimplifiedLayerNormalization", [x, skip, w], outs, epsilon=eps)
    return f"{name}/out"


def weight_bits(recipe: QuantRecipe | None) -> int:
    """The graph's matmul width from the recipe's fields: 0 (fp32 MatMul), 8 or 4."""
    return 0 if recipe is None or recipe.weight_bits == 32 else recipe.weight_bits


def build_graph(
    model: Transformer, recipe: QuantRecipe | None, *, data: BinaryIO | None = None,
    location: str = "", invariant: bool = False, plan: dict[str, int] | None = None,
    grids: dict[str, list[Grid]] | None = None, outliers: dict[str, np.ndarray] | None = None,
) -> Any:  # fmt: skip
    """The fused ``onnx.ModelProto`` of ``model``: weights inline, or with ``data`` written to
    that open file as external data named ``location`` (see ``GraphWriter``). ``plan``: bits of
    named body matmuls where they differ from the recipe's (``exporters.quant.int4_plan``).
    ``grids`` / ``outliers``: matmuls kept on their GGUF grids, and the input channels taken out
    of some of them (``gguf_grid.grid_linear``).

    ``invariant``: batch-invariant attention from plain ops (``invariant``, ``CacheIO.CHUNK``)
    instead of ``GroupQueryAttention`` (``CacheIO.SHARED``)."""
    import onnx
    from onnx import TensorProto, helper

    a = model.args
    bits = weight_bits(recipe)
    act_rows = recipe is not None and recipe.activations is Activations.ROWS
    g = GraphWriter(bits, recipe.group_size if recipe else 32, data=data, location=location,
                    act_rows=act_rows, plan=plan, grids=grids, outliers=outliers)  # fmt: skip
    cos, sin = (
        model.get_buffer("rope_cos"),
        model.get_buffer("rope_sin"),
    )  # the eager model's own tables (scaling included)
    g.const("cos_cache", cos[:, : a.head_dim // 2].contiguous())
    g.const("sin_cache", sin[:, : a.head_dim // 2].contiguous())
    if invariant:
        onnx_invariant.prepare(g, n_heads=a.n_heads, n_kv_heads=a.n_kv_heads, head_dim=a.head_dim)
    pos = None if invariant else _positions(g)
    if "embed_tokens" in g.grids:
        grid_embedding(g, gc.TOKEN_IDS, g.grids["embed_tokens"][0], "embeds")
    else:
        emb = g.const("embed_tokens.weight", model.model.embed_tokens.weight)
        g.node("Gather", [emb, gc.TOKEN_IDS], ["embeds"])
    x, skip, eps = "embeds", None, a.norm_eps
    for i in range(a.n_layers):
        layer = _layer(model, i)
        h = _norm(g, x, skip, layer.input_layernorm.weight, f"layers.{i}.input_norm", eps)
        x, skip = _attention(g, model, i, h, pos), f"layers.{i}.input_norm/sum"
        h = _norm(g, x, skip, layer.post_attention_layernorm.weight, f"layers.{i}.post_norm", eps)
        x, skip = _mlp(g, model, i, h), f"layers.{i}.post_norm/sum"
    h = _norm(g, x, skip, model.model.norm.weight, "final_norm", eps)
    _lm_head(g, model, _rows_from(g, h), tied=a.tie_embeddings and bits == 0)
    cache: list[str | int] = ["batch", a.n_kv_heads, "cache_len", a.head_dim]  # max_seq_len
    n, graph = 2 * a.n_layers, g.model.graph
    io = gc.CacheIO.CHUNK if invariant else gc.CacheIO.SHARED
    out_cache: list[str | int] = [1, a.n_kv_heads, "T", a.head_dim] if invariant else cache
    graph.name = "omnidraft_fused"
    graph.node.extend(g.nodes)
    graph.input.extend([
        helper.make_tensor_value_info(gc.TOKEN_IDS, TensorProto.INT64, [1, "T"]),
        helper.make_tensor_value_info(gc.INPUT_POS, TensorProto.INT64, ["T"]),
        *(helper.make_tensor_value_info(gc.cache_in(j), TensorProto.FLOAT, cache) for j in range(n)),
        helper.make_tensor_value_info(gc.LOGITS_FROM, TensorProto.INT64, [1]),  # overridable
    ])  # fmt: skip
    graph.output.extend([
        helper.make_tensor_value_info(gc.LOGITS, TensorProto.FLOAT, [1, "rows", a.vocab_size]),
        *(helper.make_tensor_value_info(name, TensorProto.FLOAT, out_cache)
          for name in gc.output_names(a.n_layers, io)[1:]),
    ])  # fmt: skip
    g.model.ir_version = onnx.IR_VERSION
    g.model.producer_name = "omnidraft-deploy"
    g.model.opset_import.extend([helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])
    return g.model


def weight_bytes(
    model: Transformer, recipe: QuantRecipe | None, plan: dict[str, int] | None = None
) -> int:
    """Bytes the fused graph's initializers will take (decides external data before building):
    fp32 tables and norms, ``bits/8`` per quantised weight plus a 4-byte scale per block (int4:
    and a 4-byte offset), each body matmul at its ``plan`` width, the head at 8 bits in an int4
    graph (``_lm_head``)."""
    a = model.args
    bits = weight_bits(recipe)
    block = recipe.group_size if recipe else 32
    head_bits = 8 if bits == 4 else bits
    width = {id(model.lm_head.weight): head_bits}
    if plan:
        for fused, linears in fused_linears(model):
            width |= {id(m.weight): plan.get(fused, bits) for m in linears}
    total = 0
    for name, p in model.named_parameters():
        b = width.get(id(p), bits) if "embed_tokens" not in name and p.dim() == 2 else 0
        if b:  # codes, a scale per block, an offset per block at 4 bits
            total += p.numel() * b // 8 + p.numel() // block * (8 if b == 4 else 4)
        else:
            total += p.numel() * 4
    if bits and a.tie_embeddings:  # the head is a quantised copy of the table
        total += a.vocab_size * a.dim * head_bits // 8 + a.vocab_size * a.dim // block * 4
    return total


def _rows_from(g: GraphWriter, h: str) -> str:
    """``h[:, logits_from:, :]``: the rows the lm_head scores. ``gc.LOGITS_FROM`` is a graph input
    with an initializer ``[0]`` of its name (ONNX Runtime: an overridable initializer), so a call
    that does not feed it gets all T rows; a prefill feeds ``T - 1``. Cut before the head, whose
    every row is its own arithmetic (per-row activation quantisation): a row is the same alone."""
    g.const(gc.LOGITS_FROM, np.array([0], np.int64))
    end = g.const("final_norm/rows_end", np.array([np.iinfo(np.int64).max], np.int64))
    axis = g.const("final_norm/rows_axis", np.array([1], np.int64))
    g.node("Slice", [h, gc.LOGITS_FROM, end, axis], ["final_norm/rows"])
    return "final_norm/rows"


def _lm_head(g: GraphWriter, model: Transformer, h: str, *, tied: bool) -> None:
    """fp32 tied head: MatMul on a Transpose of the embedding table, which ONNX Runtime folds
    into a transposed copy when the session loads (the file keeps one table; GenAI does the same).
    An int4 graph keeps its head at 8 bits, as the traced int4 recipe does: on Qwen2.5-Coder-0.5B
    a 4-bit head took teacher-forced top-1 from 0.89 to 0.81 (3 shipped prompts, 74 rows).
    """
    if not tied:
        bits = 8 if g.bits == 4 else None
        g.node("Identity", [g.linear("lm_head", h, model.lm_head.weight, bits=bits)], [gc.LOGITS])
        return
    g.node("Transpose", ["embed_tokens.weight"], ["lm_head.weight_t"], perm=[1, 0])
    g.node("MatMul", [h, "lm_head.weight_t"], [gc.LOGITS])


def save_model(proto: Any, path: Path) -> None:
    """``onnx.save`` to ``path`` as it is (external tensors keep their ``location``)."""
    import onnx

    onnx.save(proto, str(path))
