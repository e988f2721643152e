"""XNNPACK ``gguf4`` (``exporters.xnnpack.gguf_quant``): linears built from a GGUF's own Q4_K
blocks compute the dequantised weights' matmul (up to int8 activations), the embedding gathers the
grid's rows exactly, a mismatching file is refused, and a tiny model with a written GGUF exports
to a ``.pte`` that verifies against the eager model the GGUF dequantises to."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from omnidraft_deploy.exporters.quant.gguf_grid import READERS, Grid

from omnidraft_deploy.catalog.backends import get_recipe
from omnidraft_deploy.reference.model import build_model

gguf = pytest.importorskip("gguf")
pytest.importorskip("executorch")
pytest.importorskip("torchao")
from gguf import GGMLQuantizationType as T  # noqa: E402
from tiny_gguf import PROMPTS, SPEC, k_blocks, write_tiny_gguf  # noqa: E402

REAL = Path("~/.cache/omnidraft-deploy/assets/qwen2.5-1.5b-gguf/"
            "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf").expanduser()  # fmt: skip


def test_int4_linear_from_q4_k_blocks_is_the_dequantised_matmul() -> None:

    grid = READERS["Q4_K"](k_blocks("Q4_K", rows=48, cols=512, seed=1))
    _assert_matmul(grid, seed=2)


@pytest.mark.skipif(not REAL.exists(), reason="the Qwen2.5-Coder-1.5B GGUF is not cached")
def test_int4_linear_from_the_real_q4_k_tensor() -> None:
    reader = gguf.GGUFReader(str(REAL))
    tensor = next(t for t in reader.tensors if t.name == "blk.0.attn_k.weight")
    assert tensor.tensor_type.name == "Q4_K"
    _assert_matmul(READERS["Q4_K"](np.asarray(tensor.data)), seed=3)


def _assert_matmul(grid: Grid, seed: int) -> None:
    """The eager ``Int4GroupLinear`` on ``grid`` equals ``x @ w.T`` (w: the GGUF dequantised)
    within int8 per-token activation rounding, and a symmetric re-rounding of w does not."""
    from omnidraft_deploy.exporters.xnnpack.gguf_quant import grid_linear

    n, k = grid.codes.shape
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(3, k, generator=gen)
    w = torch.from_numpy(grid.dequantize())
    bias = torch.randn(n, generator=gen) * 0.1
    ref = x @ w.T + bias
    with torch.no_grad():
        got = grid_linear(grid, bias)(x)
    rel = float((got - ref).norm() / ref.norm())
    # int8 per-token activations: |x| / 254 per element on average, a ~0.3 % rms error here
    assert 0 < rel < 0.01, rel
    exact = grid_exact(grid, x) + bias
    assert float((got - exact).norm() / ref.norm()) < 1e-5


def grid_exact(grid: Grid, x: torch.Tensor) -> torch.Tensor:
    """What ``Int4GroupLinear`` computes, done exactly: int8 rows x the centred codes, fp32 group
    sums x the constants."""
    step = torch.from_numpy(grid.scales())
    centred = step.repeat_interleave(32, 1) * (torch.from_numpy(grid.codes).float() - 8)
    constant = 8 * step - torch.from_numpy(grid.minimums())
    sums = x.reshape(len(x), -1, 32).sum(-1)
    return int8_rows(x) @ centred.T + sums @ constant.T


def _split_case(seed: int) -> tuple[Grid, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Q4_K linear, its exact weight, and a batch of inputs whose row 0 is a sink row: two
    channels thousands of times larger than the rest (Qwen2.5's post-attention norm output)."""
    grid = READERS["Q4_K"](k_blocks("Q4_K", rows=64, cols=512, seed=seed))
    w = torch.from_numpy(grid.dequantize())
    x = torch.randn(4, 512, generator=torch.Generator().manual_seed(seed + 1))
    idx = torch.tensor([17, 300])
    x[0, idx] = torch.tensor([3000.0, -1800.0])
    return grid, w, x, idx


def test_outlier_split_is_the_exact_matmul_up_to_the_other_channels_int8() -> None:
    """``OutlierSplitLinear`` = int8 rows of ``x`` without the outlier channels x the GGUF codes,
    plus the outlier channels x the exact columns in fp32: nothing else is rounded."""
    from omnidraft_deploy.exporters.xnnpack.gguf_quant import grid_linear
    from omnidraft_deploy.exporters.xnnpack.outliers import OutlierSplitLinear

    grid, w, x, idx = _split_case(seed=20)
    split = OutlierSplitLinear.wrap(grid_linear(grid, None), w, idx)
    mask = torch.ones(512)
    mask[idx] = 0
    with torch.no_grad():
        got = split(x)
    exact = grid_exact(grid, x * mask) + x[:, idx] @ w[:, idx].T
    assert float((got - exact).abs().max()) < 1e-3  # fp32 sums of terms up to ~1e4


def test_a_massive_channel_breaks_plain_int8_rows_not_the_split() -> None:
    from omnidraft_deploy.exporters.xnnpack.gguf_quant import grid_linear
    from omnidraft_deploy.exporters.xnnpack.outliers import OutlierSplitLinear

    grid, w, x, idx = _split_case(seed=30)
    plain = grid_linear(grid, None)
    split = OutlierSplitLinear.wrap(grid_linear(grid, None), w, idx)
    with torch.no_grad():
        ref, got_plain, got_split = x @ w.T, plain(x), split(x)
    # the sink row's other channels' share of the output: what one int8 scale per row crushes
    rest = x[0].index_fill(0, idx, 0) @ w.T
    plain_err = float((got_plain[0] - ref[0]).abs().max() / rest.abs().max())
    split_err = float((got_split[0] - ref[0]).abs().max() / rest.abs().max())
    assert plain_err > 0.5, plain_err  # the int8 step (~19) swamps channels of size ~1
    assert split_err < 0.05, split_err
    # ordinary rows are no worse for the split
    assert float((got_split[1:] - ref[1:]).abs().max()) <= 1.5 * float(
        (got_plain[1:] - ref[1:]).abs().max()
    )


def test_outlier_channels_are_the_largest_inputs_on_calibration_text() -> None:
    from omnidraft_deploy.exporters.quant.outliers import outlier_channels

    model = build_model(SPEC, seed=6, max_seq_len=32).eval()
    with torch.no_grad():  # a post-attention norm weight with two huge channels
        model.model.layers[1].post_attention_layernorm.weight[[5, 77]] = 400.0
    got = outlier_channels(model, PROMPTS, k=2, kinds=("gate_proj", "up_proj"))
    assert set(got) == {
        f"model.layers.{i}.mlp.{p}" for i in range(2) for p in ("gate_proj", "up_proj")
    }
    assert got["model.layers.1.mlp.gate_proj"].tolist() == [5, 77]
    assert torch.equal(got["model.layers.1.mlp.up_proj"], got["model.layers.1.mlp.gate_proj"])


def int8_rows(x: torch.Tensor) -> torch.Tensor:
    """torchao's dynamic int8 per-token activations (asymmetric, -128..127), dequantised."""
    lo, hi = x.amin(-1, keepdim=True).clamp(max=0), x.amax(-1, keepdim=True).clamp(min=0)
    scale = (hi - lo) / 255
    zero = (-128 - torch.round(lo / scale)).clamp(-128, 127)
    return ((torch.round(x / scale) + zero).clamp(-128, 127) - zero) * scale


def test_embedding_gathers_the_grid_rows_exactly() -> None:
    from omnidraft_deploy.exporters.xnnpack.gguf_quant import grid_embedding

    pytest.importorskip("executorch.exir.passes._quant_patterns_and_replacements")
    grid = READERS["Q4_K"](k_blocks("Q4_K", rows=10, cols=256, seed=4))
    ids = torch.tensor([[3, 0, 9, 3]])
    with torch.no_grad():
        got = grid_embedding(grid)(ids)[0]
    want = torch.from_numpy(grid.dequantize())[ids[0]]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    q8 = READERS["Q8_0"](gguf.quants.quantize(np.random.default_rng(5).standard_normal((10, 64)).astype(np.float32), T.Q8_0))  # fmt: skip
    with torch.no_grad():
        got8 = grid_embedding(q8)(ids)[0]
    torch.testing.assert_close(got8, torch.from_numpy(q8.dequantize())[ids[0]], rtol=0, atol=0)


def test_a_tiny_model_exports_through_gguf4(tmp_path: Path) -> None:
    from omnidraft_deploy.exporters.exportable import graph_info
    from omnidraft_deploy.exporters.quant.outliers import outlier_channels
    from omnidraft_deploy.exporters.verify import verify_artifact
    from omnidraft_deploy.exporters.xnnpack.lower import export_pte

    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    recipe = get_recipe("xnnpack", "gguf4")
    path = tmp_path / "target.pte"
    outliers = outlier_channels(model, PROMPTS, k=3)  # gate / up of both layers
    assert len(outliers) == 4
    facts = export_pte(model, path, recipe=recipe, eos_ids=(2,), gguf=tmp_path / "tiny.gguf",
                       outliers=outliers)  # fmt: skip
    assert facts["gguf_grid"]["matrices_4bit"] == 12 and facts["gguf_grid"]["matrices"] == 14
    assert facts["gguf_grid"]["embedding"] == "4-bit Q4_K"
    assert {"quantize", "torch_export", "lower", "serialize"} <= set(facts["stages"])
    # graph nodes: 12 int4 matmuls (each with its fp32 group sums and constant-table matmuls),
    # 2 + head at int8; each of the 4 split linears adds 2 fp32 ones (one-hot selection, columns)
    assert facts["matmul_bits"] == {"linear_4bit": 12, "linear_8bit": 3,
                                    "linear_fp32": 2 * 12 + 8}  # fmt: skip
    # the split's mask and selection run in XNNPACK (only the rope tables' gathers do not)
    left = facts["non_delegated_ops"]
    assert "aten_mul_tensor" not in left and left.get("aten_index_select_default", 0) <= 2, left
    info = graph_info(model, SPEC, file=path.name, quantization="gguf4", seq_len=None)
    result = verify_artifact(path, info, model, recipe, PROMPTS)
    assert result["max_abs_logit_diff"] < 0.5 * recipe.tolerance
    assert result["top1_agreement"] >= 0.9


def test_a_tiny_model_exports_through_gguf8(tmp_path: Path) -> None:
    """``gguf8``: the same GGUF, every matrix at 8da8w (no 4-bit kernel, no group-constant
    matmul), the embedding still on its 4-bit grid; it verifies as gguf4 does."""
    from omnidraft_deploy.exporters.exportable import graph_info
    from omnidraft_deploy.exporters.verify import verify_artifact
    from omnidraft_deploy.exporters.xnnpack.lower import export_pte

    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    recipe = get_recipe("xnnpack", "gguf8")
    path = tmp_path / "target.pte"
    facts = export_pte(model, path, recipe=recipe, eos_ids=(2,), gguf=tmp_path / "tiny.gguf")
    assert facts["gguf_grid"]["matrices_4bit"] == 0 and facts["gguf_grid"]["matrices"] == 14
    assert facts["gguf_grid"]["embedding"] == "4-bit Q4_K"
    assert facts["matmul_bits"] == {"linear_4bit": 0, "linear_8bit": 15, "linear_fp32": 0}
    info = graph_info(model, SPEC, file=path.name, quantization="gguf8", seq_len=None)
    result = verify_artifact(path, info, model, recipe, PROMPTS)
    assert result["max_abs_logit_diff"] < 0.5 * recipe.tolerance
    assert result["top1_agreement"] >= 0.9


def test_a_gguf_of_other_weights_is_refused(tmp_path: Path) -> None:
    from omnidraft_deploy.exporters.xnnpack.gguf_quant import gguf_quantized

    write_tiny_gguf(tmp_path / "tiny.gguf")
    other = build_model(SPEC, seed=7, max_seq_len=32)
    with pytest.raises(ValueError, match=r"blk\.0\.attn_q\.weight .* does not match"):
        gguf_quantized(other, tmp_path / "tiny.gguf")


def test_zero_and_negative_scales_become_positive_steps_exactly() -> None:
    """XNNPACK refuses a blockwise scale <= 0: Q4_K blocks with a 0 scale and Q4_0 blocks with a
    negative ``d`` are rewritten on positive steps without changing a weight."""
    from omnidraft_deploy.exporters.xnnpack.gguf_quant import positive_steps

    raw = k_blocks("Q4_K", rows=4, cols=256, seed=8)
    raw[:, 4:16] = 0  # every 6-bit scale and minimum 0: all blocks scale 0
    raw[0, 4] = 5  # but a few
    grids = [READERS["Q4_K"](raw),
             READERS["Q4_0"](gguf.quants.quantize(np.random.default_rng(9).standard_normal((4, 256)).astype(np.float32), T.Q4_0))]  # fmt: skip
    for grid in grids:
        codes, step, constant = positive_steps(grid)
        assert bool((step > 0).all()) and int(codes.max()) <= 15
        n, k = codes.shape
        w = step.repeat_interleave(32, 1) * (codes.float() - 8) + constant.repeat_interleave(32, 1)
        torch.testing.assert_close(w, torch.from_numpy(grid.dequantize()), rtol=0, atol=1e-6)
    assert bool((torch.from_numpy(grids[1].scales()) < 0).any())  # the Q4_0 case is exercised


def test_spill_maps_anonymous_weights_and_skips_file_backed_ones(tmp_path: Path) -> None:
    from omnidraft_deploy.exporters.xnnpack.spill import _inside, file_mappings, spill_weights

    model = torch.nn.Sequential(torch.nn.Linear(1024, 512), torch.nn.LayerNorm(8))
    before = model[0].weight.detach().clone()
    assert not _inside(model[0].weight, file_mappings())
    assert spill_weights(model, tmp_path) == 1024 * 512 * 4  # the small parameters stay
    assert _inside(model[0].weight, file_mappings()) and not _inside(
        model[1].weight, file_mappings()
    )
    assert torch.equal(model[0].weight, before)
    assert spill_weights(model, tmp_path) == 0  # file-backed now: not copied again
    assert not list(tmp_path.iterdir())


def int8_groups(x: torch.Tensor, groups: int) -> torch.Tensor:
    """``int8_rows`` with each row cut into ``groups`` equal column groups, each its own scale."""
    return int8_rows(x.unflatten(-1, (groups, -1))).flatten(-2)


def test_grouped_activations_are_int8_per_column_group_times_the_codes() -> None:
    """``GroupedActLinear`` on a Q4_K linear's kernel = int8 scales per (row, group of K / G
    columns) x the GGUF codes, plus the constant table on the fp32 sums: what one int8 scale per
    row gets wrong (a large channel in one group) stays in that group."""
    from omnidraft_deploy.exporters.xnnpack.act_groups import group_activations
    from omnidraft_deploy.exporters.xnnpack.gguf_quant import grid_linear

    grid = READERS["Q4_K"](k_blocks("Q4_K", rows=64, cols=512, seed=40))
    w = torch.from_numpy(grid.dequantize())
    x = torch.randn(1, 5, 512, generator=torch.Generator().manual_seed(41))
    x[0, :, 7] = 200.0  # a large channel in group 0 of 4: the other 3 groups get 1 / 200 steps
    bias = torch.randn(64, generator=torch.Generator().manual_seed(42))
    holder = torch.nn.Module()
    holder.q_proj = grid_linear(grid, bias)
    plain = grid_linear(grid, bias)
    assert group_activations(holder, {"q_proj": 4, "k_proj": 2}) == 1
    with torch.no_grad():
        got, got_plain = holder.q_proj(x)[0], plain(x)[0]
    step = torch.from_numpy(grid.scales())
    centred = step.repeat_interleave(32, 1) * (torch.from_numpy(grid.codes).float() - 8)
    constant = 8 * step - torch.from_numpy(grid.minimums())
    want = int8_groups(x[0], 4) @ centred.T + x[0].unflatten(-1, (-1, 32)).sum(-1) @ constant.T
    assert float((got - want - bias).abs().max()) < 1e-3  # fp32 sums, outputs up to ~300
    exact = x[0] @ w.T + bias
    err, err_plain = (got - exact).norm(), (got_plain - exact).norm()
    # one group in 4 keeps the coarse step: about sqrt(1 / 4) of the error
    assert err < 0.6 * err_plain, (err, err_plain)


def test_a_tiny_model_exports_with_activation_groups(tmp_path: Path) -> None:
    """gguf4 with 4 activation groups on gate / up / down: every new node (mask ``mul``, views,
    ``permute``, the fp32 sum) is delegated to XNNPACK, and the ``.pte`` verifies."""
    from omnidraft_deploy.exporters.exportable import graph_info
    from omnidraft_deploy.exporters.verify import verify_artifact
    from omnidraft_deploy.exporters.xnnpack.lower import export_pte

    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    groups = (("gate_proj", 4), ("up_proj", 4), ("down_proj", 4))
    recipe = dataclasses.replace(get_recipe("xnnpack", "gguf4"), act_groups=groups)
    path = tmp_path / "target.pte"
    facts = export_pte(model, path, recipe=recipe, eos_ids=(2,), gguf=tmp_path / "tiny.gguf")
    assert facts["act_groups"] == 6
    # each grouped linear adds one fp32 linear (the sum over its groups)
    assert facts["matmul_bits"] == {"linear_4bit": 12, "linear_8bit": 3,
                                    "linear_fp32": 2 * 12 + 6}  # fmt: skip
    # nothing new outside XNNPACK: the plain gguf4 tiny graph leaves 6 unsqueeze_copy and 36
    # view_copy (rope, attention: 2 a layer are the (KV, L, D) views of the caches' used slots,
    # of a dynamic shape XNNPACK does not take, run as copy-free et_view; the constant tables'
    # group sums), no mul and no permute
    left = facts["non_delegated_ops"]
    assert "aten_mul_tensor" not in left and "aten_permute_copy_default" not in left, left
    assert left["aten_unsqueeze_copy_default"] <= 6 and left["aten_view_copy_default"] <= 36
    info = graph_info(model, SPEC, file=path.name, quantization="gguf4", seq_len=None)
    result = verify_artifact(path, info, model, recipe, PROMPTS)
    assert result["max_abs_logit_diff"] < 0.5 * recipe.tolerance
    assert result["top1_agreement"] >= 0.9
