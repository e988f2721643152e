"""Export backends and their quantization recipes, as data: the one list.

The CLI derives ``--backend`` choices, each backend's default ``--quantization`` and the help text
from ``BACKENDS`` and ``RECIPES``; the manifest checks a bundle's backend against ``Backend``; the
exporters look recipes up here and read their fields (``QuantRecipe``), never their names; the
export resource check reads ``bytes_per_param``. Pure data: no torch import, so ``omnidraft --help``
stays fast. The exporter function of a backend registers itself with ``exporters.register`` in its
recipe package, ``BackendInfo.module`` (``exporters/__init__.py`` imports each one).

Adding a recipe: a row here; a recipe the backend's fields cannot express also needs its backend's
recipe package (``exporters/xnnpack``, ``exporters/onnx``, ``exporters/qnn``) to read a new field.
Tolerances bound the max |logit difference| and the top-1 agreement against eager fp32 on the
verification prompts; they go into the manifest.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Backend(StrEnum):
    XNNPACK = "xnnpack"
    QNN = "qnn"
    ONNX = "onnx"


LINEAR_SCHEMES = ("none", "8da4w", "8da8w", "int8w")


class Activations(StrEnum):
    """How a recipe's weight matmuls take their activations."""

    FLOAT = "float"  # fp32 activations (weight-only or fp32 recipes; MatMulNBits blocks included)
    DYNAMIC = "dynamic"  # int8, one scale per tensor computed at run time (ORT quantize_dynamic)
    ROWS = "rows"  # int8, one scale per row / token at run time (w8a8, XNNPACK 8da*)
    STATIC = "static"  # calibrated QDQ scales (QNN HTP)


@dataclass(frozen=True)
class QuantRecipe:
    """One quantisation recipe: the exporters read these fields, never the recipe's name."""

    name: str
    backend: Backend
    tolerance: float  # max |logit diff| vs eager fp32 accepted by verification
    min_top1: float  # minimum top-1 agreement with eager fp32
    bytes_per_param: float = 0.0  # bundle bytes per parameter (disk estimate); every recipe > 0
    weight_bits: int = 32  # body weight matmuls: 32 (float), 8 or 4
    activations: Activations = Activations.FLOAT
    activation_bits: int = 32  # width of quantised activations (QDQ: 16 or 8)
    group_size: int = 32  # int4 weight group (xnnpack 8da4w) / block size (onnx int4)
    fused: bool = False  # onnx: has a fused contrib-op graph (``exporters.onnx.fused``)
    batch_invariant: bool = False  # onnx: weight matmuls bitwise batch-invariant on ORT's CPU
    linear: str = "none"  # none | 8da4w | 8da8w | int8w (xnnpack eager transform)
    head: str = ""  # the lm_head's scheme where it differs from ``linear`` (xnnpack)
    fp32_linears: tuple[str, ...] = ()  # linear kinds (e.g. "down_proj") left in fp32 (xnnpack)
    embedding_bits: int = 0  # 0: fp32 embedding table; 8: int8 per row (xnnpack)
    # SmoothQuant before export (int8 per-token activations: xnnpack 8da8w, onnx w8a8)
    smooth: bool = False
    # body matmuls at int4 where a measured plan (``exporters.quant.int4_plan``, the backend's
    # numerics) says int4 costs little; the rest at 8 bits (xnnpack 8da4w, onnx int4)
    int4_plan: bool = False
    # every weight on its own GGUF grid, read from the preset's GGUF: onnx
    # (``exporters.onnx.gguf_grid``: Q4_K / Q4_0 / Q4_1 at 4 bits with float minimums, Q6_K / Q8_0
    # exact at 8 bits); xnnpack (``exporters.xnnpack.gguf_quant``: 4-bit blocks as 8da4w on their
    # own codes, other weights 8da8w, the embedding on its grid)
    gguf_grid: bool = False
    # xnnpack: (linear kind, G) pairs; those linears' int8 activations get G scales per row, one
    # per equal group of input columns (``exporters.xnnpack.act_groups``), not one
    act_groups: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if self.tolerance <= 0 or not 0.0 <= self.min_top1 <= 1.0:
            raise ValueError(
                f"recipe {self.name}: bad tolerance {self.tolerance} / {self.min_top1}"
            )
        for scheme in (self.linear, self.head or self.linear):
            if scheme not in LINEAR_SCHEMES:
                raise ValueError(f"recipe {self.name}: unknown linear scheme {scheme!r}")
        if self.embedding_bits not in (0, 8):
            raise ValueError(f"recipe {self.name}: embedding_bits {self.embedding_bits} not 0 or 8")
        if self.weight_bits not in (4, 8, 32) or self.activation_bits not in (8, 16, 32):
            raise ValueError(
                f"recipe {self.name}: weight_bits {self.weight_bits} / activation_bits "
                f"{self.activation_bits} not in (4, 8, 32) / (8, 16, 32)"
            )
        if self.bytes_per_param <= 0:
            raise ValueError(f"recipe {self.name}: bytes_per_param {self.bytes_per_param} <= 0")

    @property
    def quantized(self) -> bool:
        """Whether any weight or activation leaves fp32 (an fp32 recipe exports as traced)."""
        float_acts = self.activations is Activations.FLOAT
        return self.weight_bits < 32 or not float_acts or self.embedding_bits > 0


@dataclass(frozen=True)
class BackendInfo:
    backend: Backend
    graph: str  # what the backend writes, in words (help text)
    default_quantization: str
    module: str  # recipe package whose ``@register`` adds the exporter (``exporters/__init__``)


BACKENDS: dict[Backend, BackendInfo] = {
    b.backend: b
    for b in (
        BackendInfo(Backend.XNNPACK, "ExecuTorch .pte, XNNPACK", "fp32",
                    "omnidraft_deploy.exporters.xnnpack"),
        BackendInfo(Backend.QNN, "static-T QDQ ONNX for the QNN HTP", "qdq-a16w8",
                    "omnidraft_deploy.exporters.qnn"),
        BackendInfo(Backend.ONNX, "ONNX + ORT mobile .ort", "fp32",
                    "omnidraft_deploy.exporters.onnx"),
    )
}  # fmt: skip


# recipe for weights published as GGUF, where no --quantization is given (``default_quantization``):
# the weights' own blocks. XNNPACK gguf4 on the 1.5B: decode 0.91 / 0.81 / 0.64x llama.cpp at 64 /
# 512 / 4,000 tokens, >= 1.25x ONNX w8a8, top-1 0.957; gguf8 decodes 0.81 / 0.74 / 0.54x but its
# verify calls cost 1.6-1.9 one-token calls, not 2.1-2.8, on an AVX2 CPU without VNNI
# (reports/xnnpack_llm/phone_path.md); on a phone's ARM cores, 4-bit kernels are not compute-bound
GGUF_DEFAULTS: dict[Backend, str] = {Backend.XNNPACK: "gguf4"}


def default_quantization(backend: str, target_gguf: bool, drafter_gguf: bool) -> tuple[str, str]:
    """``(target recipe, drafter recipe)`` when the user names none: a role whose weights are a
    GGUF gets the backend's GGUF recipe where it has one (``GGUF_DEFAULTS``), else the backend's
    default."""
    info = get_backend(backend)
    gguf = GGUF_DEFAULTS.get(info.backend, info.default_quantization)
    return (gguf if target_gguf else info.default_quantization,
            gguf if drafter_gguf else info.default_quantization)  # fmt: skip


def _x(name: str, tol: float, top1: float, linear: str, emb: int = 0, *, head: str = "",
       fp32_linears: tuple[str, ...] = (), smooth: bool = False,
       int4_plan: bool = False, gguf_grid: bool = False) -> QuantRecipe:  # fmt: skip
    bits = {"none": 32, "8da4w": 4, "8da8w": 8, "int8w": 8}[linear]
    acts = Activations.ROWS if linear.startswith("8da") else Activations.FLOAT
    size = 4.0 if bits == 32 else (0.6 if bits == 4 else 1.1)  # fp32 tables: int8 rows shrink them
    return QuantRecipe(name, Backend.XNNPACK, tol, top1, size, bits, acts,
                       8 if acts is Activations.ROWS else 32, linear=linear, head=head,
                       fp32_linears=fp32_linears, embedding_bits=emb, smooth=smooth,
                       int4_plan=int4_plan, gguf_grid=gguf_grid)  # fmt: skip


_FP32_8DA8W = ("down_proj", "o_proj", "v_proj", "q_proj", "k_proj")
RECIPES: dict[tuple[Backend, str], QuantRecipe] = {
    (r.backend, r.name): r
    for r in (
        _x("fp32", 1e-3, 1.0, "none"),
        # 8da4w: asymmetric int4 groups (exact on a GGUF Q4_1 grid), lm_head 8da8w. SmolLM2-135M in
        # eager: top-1 0.862 / 7.17 (symmetric groups, lm_head at int4: 0.478 / 24.1). Qwen2.5-0.5B
        # (no linear on a 32-wide int4 grid) with every body linear int4: .pte 13.4 / 0.823; the
        # int4 plan keeps 72 of 96 at 8da8w: 13.8 / 0.901 (one layer-0 matmul; README)
        _x("8da4w", 8.0, 0.6, "8da4w", head="8da8w", int4_plan=True),
        _x("8da4w-emb8", 8.0, 0.6, "8da4w", 8, head="8da8w", int4_plan=True),
        # gguf4: the GGUF's own blocks (exporters.xnnpack.gguf_quant): Q4_K / Q4_1 / Q4_0 as 8da4w on
        # their codes and float minimums, other weights and the lm_head 8da8w, the embedding on its
        # grid (4-bit Q4_K rows, exact Q8_0 blocks); reports/xnnpack_gguf4 (GGUF presets only).
        # SmolLM2-135M (Q4_1) .pte 5.20 / 0.894; Qwen2.5-Coder-1.5B (Q4_K_M) .pte 21.0 / 0.946: refused
        # (int8 per-token activations on Qwen's outlier channels); since then gate / up get 4 outlier
        # input channels in an exact fp32 side matmul (exporters.xnnpack.outliers): eager 1.5B
        # sink rows 21.2 -> 1.69, top-1 0.929 on 12 prompts' parity rows
        _x("gguf4", 8.0, 0.6, "8da4w", 8, head="8da8w", gguf_grid=True),
        # gguf8: the same GGUF weights (its embedding on its grid), every matrix dequantised and
        # held at 8da8w per output channel. On an AVX2 CPU without VNNI XNNPACK's 4-bit blockwise
        # GEMM is compute-bound: a 1536x8960 matmul of 8 rows costs 5.9x one row at qb4w, 2.4x at
        # qc8w, and one row costs the same at both (benchmarks/matmul_kernels --executorch),
        # so verify calls, which speculative decoding pays for, are cheaper at 8 bits
        _x("gguf8", 8.0, 0.6, "8da8w", 8, head="8da8w", gguf_grid=True),
        # 8da8w: SmoothQuant; down_proj (SwiGLU's outlier channels) and attention's linears in fp32.
        # Max |diff| / top-1 in eager on held-out text: SmolLM2-135M (579 rows), down + o + v in
        # fp32 2.28 / 0.955 (down_proj alone 4.89, down + v 6.48, all int8 8.05); Qwen2.5-0.5B (886
        # rows), down + o + v 2.99 / 0.980, and q + k too 1.08 / 0.981 (its .pte with down + o + v:
        # 3.28 on the verification prompts, over 3.0); lm_head fp32 or alpha 0.3 / 0.7 did not help
        _x("8da8w", 3.0, 0.8, "8da8w", smooth=True, fp32_linears=_FP32_8DA8W),
        # int8w: small and accurate (SmolLM2-135M 2.36 / 0.938) but slow: XNNPACK does not take
        # weight-only int8, so the portable kernels convert every weight every call (1.6 tok/s)
        _x("int8w", 3.0, 0.8, "int8w"),
        _x("int8w-emb8", 3.0, 0.8, "int8w", 8),
        QuantRecipe("fp32", Backend.ONNX, 1e-3, 1.0, 4.0, fused=True),
        # int8 weights and int8 compute (MatMulNBits accuracy_level=4, lm_head included): SmolLM2-135M
        # 2.57 / 0.976 (weight-only fp32 compute was 1.15 / 0.976 and 24x slower)
        QuantRecipe("int8", Backend.ONNX, 3.0, 0.9, 1.1, 8, fused=True, batch_invariant=True),
        # int8 weights per column x int8 activations per row (MatMulInteger) after SmoothQuant:
        # Qwen2.5-0.5B verification top-1 0.905 (int8: 0.973); cheap extra rows (verification)
        QuantRecipe(
            "w8a8",
            Backend.ONNX,
            8.0,
            0.9,
            1.1,
            8,
            Activations.ROWS,
            8,
            smooth=True,
            fused=True,
            batch_invariant=True,
        ),
        QuantRecipe("int8-dyn", Backend.ONNX, 4.0, 0.7, 1.1, 8, Activations.DYNAMIC, 8),
        # int4 (float-offset grid, 8-bit where the plan measured int4 too costly: exporters.quant.int4_plan):
        # SmolLM2-135M 3.07 / 0.950, Qwen2.5-0.5B 14.3 / 0.969 on the 12 shipped prompts (the 14.3 is
        # one row of one prompt, predicted by the plan's simulation; int8 gives 3.7 there)
        # (top-1 floor 0.6: the traced int4 graph of the random twins)
        QuantRecipe(
            "int4",
            Backend.ONNX,
            16.0,
            0.6,
            0.6,
            4,
            fused=True,
            batch_invariant=True,
            int4_plan=True,
        ),
        # gguf4: the GGUF's own grids, nothing re-rounded but Q5_x (to 8 bits); Qwen2.5-Coder-1.5B
        # Q4_K_M: reports/quant_gguf (only GGUF-published presets: no tiny twin can take it)
        QuantRecipe(
            "gguf4",
            Backend.ONNX,
            8.0,
            0.95,
            0.6,
            4,
            fused=True,
            batch_invariant=True,
            gguf_grid=True,
        ),
        # sinked graph (one or two sink tokens), rotated residual stream, LpNormalization,
        # per-channel GPTQ'd Gemm weights, calibration on prompts and start windows (exporters.qnn),
        # 12 prompts: SmolLM2-135M 8.8 / 0.974 (CPU run of the QDQ graph; simulated HTP 0.982),
        # Qwen2.5-Coder-0.5B 12.1 / 0.966 (HTP 0.972); a broken graph reads 52 / 0.04
        # (top-1 floor 0.75: random toy graphs on the HTP read 0.795)
        QuantRecipe("qdq-a16w8", Backend.QNN, 16.0, 0.75, 1.1, 8, Activations.STATIC, 16),
        QuantRecipe("qdq-u8", Backend.QNN, 3.0, 0.5, 1.1, 8, Activations.STATIC, 8),
    )
}


def get_backend(name: str) -> BackendInfo:
    """The backend called ``name``; unknown names raise ``KeyError`` listing the valid ones."""
    if name not in {b.value for b in Backend}:
        raise KeyError(f"unknown backend {name!r}; choose from {backend_names()}")
    return BACKENDS[Backend(name)]


def backend_names() -> list[str]:
    return [b.value for b in BACKENDS]


def recipe_names(backend: str) -> list[str]:
    """Valid quantization names of one backend (what ``--quantization`` accepts)."""
    return sorted(n for b, n in RECIPES if b.value == backend)


def get_recipe(backend: str, name: str) -> QuantRecipe:
    """Recipe lookup; unknown backends or names raise KeyError listing the valid ones."""
    key = (get_backend(backend).backend, name)
    if key not in RECIPES:
        raise KeyError(
            f"unknown quantization {name!r} for backend {backend}; choose from {recipe_names(backend)}"
        )
    return RECIPES[key]


def bytes_per_param() -> dict[str, float]:
    """Recipe name -> bundle bytes per parameter (the disk estimate of ``inputs``), every recipe."""
    return {name: r.bytes_per_param for (_, name), r in RECIPES.items()}


def quantization_help() -> str:
    """``--quantization`` help: every backend's recipes, its default first."""
    parts = []
    for b in BACKENDS.values():
        rest = [n for n in recipe_names(b.backend) if n != b.default_quantization]
        parts.append(f"{b.backend.value}: {'|'.join([b.default_quantization, *rest])}")
    return "; ".join(parts) + " (the first of each is its default)"
