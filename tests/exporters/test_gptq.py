"""GPTQ (``exporters.quant.gptq``): values on the int4 recipe's grid, and a smaller output error than
round-to-nearest on correlated inputs (what it exists for)."""

from __future__ import annotations

import pytest
import torch
from omnidraft_deploy.exporters.quant.gptq import gptq_int4, input_hessians

from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.reference.model import build_model


def _rtn(w: torch.Tensor, block: int = 32) -> torch.Tensor:
    """Round to nearest on the recipe's grid, written out: 16 levels from min to max per block."""
    n, k = w.shape
    wb = w.view(n, k // block, block)
    lo, hi = wb.amin(-1, keepdim=True), wb.amax(-1, keepdim=True)
    s = ((hi - lo) / 15).clamp(min=1e-8)
    return (torch.round((wb - lo) / s).clamp(0, 15) * s + lo).view(n, k)


def test_the_graph_rounding_is_round_to_nearest_and_exact_on_a_q4_1_grid() -> None:
    from omnidraft_deploy.exporters.quant.grids import int4_rtn

    gen = torch.Generator().manual_seed(1)
    w = torch.randn(8, 64, generator=gen)
    torch.testing.assert_close(int4_rtn(w, 32), _rtn(w))
    # weights published on a Q4_1 grid (offset + step * code per block) come back unchanged
    step, lo = torch.rand(8, 2, 1, generator=gen) * 0.1 + 0.01, -torch.rand(8, 2, 1, generator=gen)
    codes = torch.randint(0, 16, (8, 2, 32), generator=gen).float()
    codes[..., 0], codes[..., 1] = (
        0,
        15,
    )  # each block spans its grid (as a Q4_1 quantiser leaves it)
    q41 = (codes * step + lo).view(8, 64)
    torch.testing.assert_close(int4_rtn(q41, 32), q41, rtol=0, atol=1e-6)


def test_gptq_beats_round_to_nearest_on_the_layer_output_and_stays_on_the_grid() -> None:
    gen = torch.Generator().manual_seed(0)
    k, n = 128, 48
    mix = torch.randn(k, k, generator=gen) / k**0.5 + torch.eye(k)  # correlated input channels
    x = torch.randn(2048, k, generator=gen) @ mix
    w = torch.randn(n, k, generator=gen) * 0.05
    q = gptq_int4(w, x.T @ x / len(x))
    err_gptq = (x @ (q - w).T).norm()
    err_rtn = (x @ (_rtn(w) - w).T).norm()
    assert err_gptq < 0.8 * err_rtn
    for blk in q.view(n, k // 32, 32).unbind(1):  # at most 16 levels per row and block
        assert all(len(torch.unique(row)) <= 16 for row in blk)


def test_hessians_cover_the_chosen_linears_and_bad_shapes_are_refused() -> None:
    spec = get_preset("tiny-llama-68m")
    model = build_model(spec, seed=0, max_seq_len=32)
    hess = input_hessians(model, [[1, 2, 3, 4], [5, 6]], ("q_proj", "down_proj"))
    assert hess and all(n.endswith(("q_proj", "down_proj")) for n in hess)
    h = next(iter(hess.values()))
    torch.testing.assert_close(h, h.T)
    with pytest.raises(ValueError, match="GPTQ"):
        gptq_int4(torch.zeros(4, 48), torch.eye(48))
    with pytest.raises(ValueError, match="at least one prompt"):
        input_hessians(model, [], ("q_proj",))
