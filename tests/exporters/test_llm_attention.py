"""ExecuTorch LLM attention (``exporters/xnnpack/llm_attention``): the cache updated in place.

Eager and reloaded ``.pte`` against the reference attention; a verify call's rows equal 1-token
calls' bit for bit (what greedy speculative == target-only needs); rollback; and the per-call
costs the path exists to remove are gone from the portable kernels (cache rewrites, widened KV
heads, group sums).
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import torch

from omnidraft_deploy.catalog.backends import get_recipe
from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.reference.model import Transformer, build_model

pytest.importorskip("executorch")

SPEC = dataclasses.replace(get_preset("tiny-qwen2-7b"), vocab_size=320)  # GQA, qkv bias
IDS = torch.randint(0, 320, (1, 24), generator=torch.Generator().manual_seed(0))


def _chunks(model: torch.nn.Module, sizes: list[int]) -> torch.Tensor:
    """Logits of ``IDS[:, :sum(sizes)]`` fed in consecutive calls of ``sizes`` tokens."""
    out, pos = [], 0
    for n in sizes:
        out.append(model(IDS[:, pos : pos + n], torch.arange(pos, pos + n)))
        pos += n
    return torch.cat(out, dim=1)


@pytest.fixture(scope="module")
def eager() -> Transformer:
    return build_model(SPEC, seed=2, max_seq_len=48)


@pytest.mark.parametrize("kernel", ["prefix", "span", "custom_sdpa"])
def test_eager_matches_the_reference_attention(eager: Transformer, kernel: str) -> None:
    from omnidraft_deploy.exporters.xnnpack.llm_attention import use_llm_attention

    llm = use_llm_attention(copy.deepcopy(eager), kernel)
    with torch.no_grad():
        ref = _chunks(eager, [24])
        for sizes in ([24], [10, 1, 1, 5, 7]):
            assert (ref - _chunks(llm, sizes)).abs().max() < 1e-5


def test_unknown_kernel_lists_the_valid_ones() -> None:
    from omnidraft_deploy.exporters.xnnpack.llm_attention import InPlaceKVAttention

    with pytest.raises(ValueError, match="custom_sdpa"):
        InPlaceKVAttention(16, 2, 8, "flash")


@pytest.fixture(scope="module", params=["prefix", "span"])
def pte(
    eager: Transformer, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> tuple[Path, dict]:
    """A target program on each batch-invariant kernel: ``prefix`` (the default: a third input,
    the slots in use) and ``span`` (every slot; the two-input contract of older programs)."""
    from omnidraft_deploy.exporters.xnnpack.lower import export_pte

    path = tmp_path_factory.mktemp("llm") / f"target-{request.param}.pte"
    kwargs = {} if request.param == "prefix" else {"attention": request.param}
    cov = export_pte(eager, path, recipe=get_recipe("xnnpack", "fp32"), eos_ids=(2,), **kwargs)
    return path, cov


def _pte_calls(path: Path):
    from omnidraft_deploy.bundle import graph_contract as gc
    from omnidraft_deploy.optional import pte_program

    method = pte_program(path).load_method(gc.PTE_FORWARD)

    def call(start: int, n: int) -> torch.Tensor:
        ids = IDS[:, start : start + n].numpy()
        return torch.from_numpy(gc.pte_step(method, ids, gc.contiguous_positions(start, n)))

    return call


def test_pte_rows_are_batch_invariant_and_rollback_is_free(eager: Transformer, pte) -> None:
    path, cov = pte
    call = _pte_calls(path)
    full = call(0, 24)  # (24, V)
    with torch.no_grad():
        assert (full - _chunks(eager, [24])[0]).abs().max() < 1e-4
    for n in (1, 2, 5, 9):  # a verify call of n tokens after a 12-token prefix
        call(0, 12)
        assert torch.equal(call(12, n), full[12 : 12 + n]), f"{n}-token rows differ"
    call(0, 20)  # wrote slots 12..19; a rollback to 12 re-feeds from there
    assert torch.equal(call(12, 3), full[12:15])
    for start in (1, 7, 16, 23):  # rows over spans of every width equal the 24-token call's
        call(0, start)
        assert torch.equal(call(start, 1), full[start : start + 1]), f"row {start} differs"


def test_the_default_program_takes_the_spans_as_inputs(pte) -> None:
    """``prefix`` programs take ``cache_slots`` and ``logit_rows`` (``graph_contract``) and say so
    to callers that cannot read a method's metadata (the Android adapter); ``span`` ones keep two
    inputs. The last rows alone equal the same rows of a full call, bit for bit."""
    from omnidraft_deploy.runtime.executorch_model import constant

    from omnidraft_deploy.bundle import graph_contract as gc
    from omnidraft_deploy.optional import pte_program

    path, cov = pte
    program = pte_program(path)
    method = program.load_method("forward")
    inputs = method.metadata.num_inputs()
    assert inputs == int(constant(program, "get_forward_inputs"))
    assert (cov["attention"], inputs) in {("prefix", 4), ("span", 2)}
    ids, pos = IDS[:, :20].numpy(), gc.contiguous_positions(0, 20)
    full = gc.pte_step(method, ids, pos)
    for rows in (1, 3, 20):
        tail = gc.pte_step(method, ids, pos, rows)
        assert tail.shape == (rows, full.shape[1]) and (tail == full[-rows:]).all()


def test_no_per_call_cache_rewrite_left_in_the_portable_kernels(pte) -> None:
    _, cov = pte
    portable = cov["non_delegated_ops"]
    for op in ("index_put", "expand_copy", "bmm", "softmax", "linear", "sum"):
        assert not any(op in name for name in portable), (op, portable)
    from omnidraft_deploy.exporters.xnnpack.lower import program_ops

    ops = program_ops(pte[0].read_bytes())  # the serialized program's instructions, per call
    assert ops["llama::update_cache.out"] == 2 * SPEC.n_layers  # in place: no copy-back
    assert not any("index_put" in op or "expand" in op for op in ops), ops


def test_a_drafter_pte_on_custom_sdpa_matches_eager(eager: Transformer, tmp_path: Path) -> None:
    """``custom_sdpa`` (ExecuTorch's own LLM attention, kept as an option: its rows are close to
    eager but not batch invariant) still exports and runs."""
    from omnidraft_deploy.exporters.xnnpack.lower import export_pte, program_ops

    path = tmp_path / "drafter.pte"
    export_pte(eager, path, recipe=get_recipe("xnnpack", "fp32"), eos_ids=(2,),
               attention="custom_sdpa")  # fmt: skip
    assert program_ops(path.read_bytes())["llama::custom_sdpa.out"] == SPEC.n_layers
    call = _pte_calls(path)
    with torch.no_grad():
        ref = _chunks(eager, [24])[0]
    assert (call(0, 16) - ref[:16]).abs().max() < 1e-4
    assert (call(16, 8) - ref[16:]).abs().max() < 1e-4
