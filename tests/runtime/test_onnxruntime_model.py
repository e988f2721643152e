"""ORT wrapper vs eager PyTorch: dynamic-T and static-T graphs, chunking, padding and rollback."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from runtime_helpers import MAX_SEQ_LEN, cached_onnx, tiny_model

from omnidraft_deploy.reference.model import Transformer
from omnidraft_deploy.reference.torch_lm import EagerLM

pytest.importorskip("onnxruntime")
from omnidraft_deploy.runtime.onnxruntime_model import OrtModel  # noqa: E402

TOL = 1e-4  # fp32 ORT vs eager; measured ~1e-6 on these graphs
# graph name -> (n_kv_heads, static T or None)
GRAPHS = {"static3": (4, 3), "gqa_static3": (2, 3), "gqa_dynamic": (2, None)}


class Graphs(dict[str, OrtModel]):
    """Exports each graph on first use, so one failing export fails only its own tests."""

    def __init__(self, tmp: Path, eager: dict[int, Transformer]) -> None:
        super().__init__()
        self.tmp, self.eager = tmp, eager

    def __missing__(self, name: str) -> OrtModel:
        kv, seq_len = GRAPHS[name]
        path, info = cached_onnx(self.tmp, 64, 3, kv, seq_len)
        self[name] = OrtModel(path, info)
        return self[name]


Setup = tuple[dict[int, EagerLM], Graphs]


def _script(model: EagerLM | OrtModel) -> list[torch.Tensor]:
    """Prefill 7, three single tokens, rollback to 5 and re-feed 4 other tokens, a chunk of 3."""
    calls = [
        ([3, 1, 4, 1, 5, 9, 2], 0),
        ([6], 7),
        ([5], 8),
        ([3], 9),
        ([7, 7, 1, 2], 5),
        ([8, 0, 4], 9),
    ]
    return [model.forward(torch.tensor(ids), start) for ids, start in calls]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    tmp = tmp_path_factory.mktemp("ort")
    eager = {kv: tiny_model(64, seed=3, n_kv_heads=kv) for kv in (2, 4)}
    return {kv: EagerLM(m) for kv, m in eager.items()}, Graphs(tmp, eager)


@pytest.mark.parametrize("graph", sorted(GRAPHS))
def test_logits_match_eager_through_rollback(setup: Setup, graph: str) -> None:
    eager, graphs = setup
    model = graphs[graph]
    for a, b in zip(_script(model), _script(eager[GRAPHS[graph][0]]), strict=True):
        assert a.dtype == torch.float32 and a.shape == b.shape
        assert float((a - b).abs().max()) < TOL


@pytest.mark.parametrize("graph", sorted(GRAPHS))
def test_forward_tail_falls_back_on_graphs_without_logits_from(setup: Setup, graph: str) -> None:
    """Traced graphs (dynamic or static T) take no ``logits_from``: ``forward_tail`` is the
    tail of every row (old bundles keep working), one counted call."""
    model = setup[1][graph]
    assert not model.graph.tail_alone
    ids, calls = torch.tensor([3, 1, 4, 1, 5, 9, 2]), model.n_calls
    tail = model.forward_tail(ids, 0, 3)
    assert tail.shape == (3, model.vocab_size) and model.n_calls == calls + 1
    assert torch.equal(tail, model.forward(ids, 0)[-3:])


def test_static_graph_padding_never_writes_cache(setup: Setup) -> None:
    """A 1-token call on a T=3 graph pads 2 rows; their k/v must not land in the host cache."""
    model = setup[1]["static3"]
    model.graph.reset()  # zero caches (new buffers, bound afresh)
    model.forward(torch.tensor([5]), 4)
    for cache in model.graph.caches:
        assert np.abs(cache[:, :, 4]).sum() > 0
        assert np.abs(cache[:, :, [0, 1, 2, 3, 5, 6]]).sum() == 0


def test_static_graph_at_end_of_context(setup: Setup) -> None:
    """Padding positions clamp at max_seq_len - 1; the last real slot must still be exact."""
    eager, graphs = setup[0][4], setup[1]["static3"]
    ids = torch.arange(MAX_SEQ_LEN) % 60
    for model in (eager, graphs):
        model.forward(ids[:-1], 0)
    a = graphs.forward(ids[-1:], MAX_SEQ_LEN - 1)
    b = eager.forward(ids[-1:], MAX_SEQ_LEN - 1)
    assert float((a - b).abs().max()) < TOL


def test_out_of_range_is_refused(setup: Setup) -> None:
    with pytest.raises(ValueError, match=r"v64_s3_kv2_tNone\.onnx: tokens 31\.\.33 outside"):
        setup[1]["gqa_dynamic"].forward(torch.tensor([1, 2]), MAX_SEQ_LEN - 1)


@pytest.mark.parametrize("n_kv_heads", [1, 2])
def test_fused_graph_matches_eager_through_rollback(tmp_path: Path, n_kv_heads: int) -> None:
    """The fused graph (GroupQueryAttention writing the bound cache in place) follows the same
    position-addressed contract: rollback is a call at an earlier position."""
    import dataclasses

    from omnidraft_deploy.exporters.exportable import graph_info
    from omnidraft_deploy.exporters.onnx.graph import export_onnx
    from runtime_helpers import tiny_spec

    from omnidraft_deploy.reference.model import build_model

    # GroupQueryAttention needs head_dim % 16 == 0: 2 query heads of 16
    spec = dataclasses.replace(tiny_spec(64), n_heads=2, n_kv_heads=n_kv_heads)
    model = build_model(spec, seed=3, init_std=0.2)
    path = tmp_path / "fused.onnx"
    info = graph_info(model, spec, file=path.name, quantization="fp32", seq_len=None)
    export_onnx(model, path, info=info, fused=True)
    ort_model = OrtModel(path, info, threads=1)
    for a, b in zip(_script(ort_model), _script(EagerLM(model)), strict=True):
        assert float((a - b).abs().max()) < TOL


def test_fused_graph_logits_belong_to_the_caller(tmp_path: Path) -> None:
    """Fused (SHARED-cache) graphs write the logits straight into the returned array: a later
    call must not overwrite an earlier call's logits, and 4 KiB pages give the same numbers."""
    import dataclasses

    from omnidraft_deploy.exporters.exportable import graph_info
    from omnidraft_deploy.exporters.onnx.graph import export_onnx
    from runtime_helpers import tiny_spec

    from omnidraft_deploy.reference.model import build_model

    spec = dataclasses.replace(tiny_spec(64), n_heads=2, n_kv_heads=2)
    model = build_model(spec, seed=5, init_std=0.2)
    path = tmp_path / "fused.onnx"
    info = graph_info(model, spec, file=path.name, quantization="fp32", seq_len=None)
    export_onnx(model, path, info=info, fused=True)
    outs = {}
    for huge_pages in (True, False):
        ort_model = OrtModel(path, info, threads=1, huge_pages=huge_pages)
        outs[huge_pages] = _script(ort_model)
        first = outs[huge_pages][0]
        assert not np.shares_memory(first.numpy(), outs[huge_pages][1].numpy())
        again = ort_model.graph.run(np.array([[3, 1, 4, 1, 5, 9, 2]]), np.arange(7, dtype=np.int64))
        assert torch.equal(first, torch.from_numpy(again))  # the prefill's rows, still intact
    for a, b in zip(outs[True], outs[False], strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("spin", "allow", "stop"),
    [("on", "1", "0"), ("off", "0", "0"), ("in-call", "1", "1")],
)
def test_spin_modes_reach_the_session(
    tmp_path_factory: pytest.TempPathFactory, spin: str, allow: str, stop: str
) -> None:
    """The runtime's sessions spin only inside a call (``Spin.IN_CALL``, the measured best for
    a drafter and a target taking turns on the cores); each mode sets ORT's own config keys."""
    from omnidraft_deploy.host.onnx_host import Spin, cpu_session

    # the session-wide folder: a passed test's tmp_path is deleted, and the export is cached
    path, info = cached_onnx(tmp_path_factory.getbasetemp(), 256, 0, 2, None)
    opts = cpu_session(path, threads=1, spinning=Spin(spin)).get_session_options()
    for pool in ("intra_op", "inter_op"):
        assert opts.get_session_config_entry(f"session.{pool}.allow_spinning") == allow
    assert opts.get_session_config_entry("session.force_spinning_stop") == stop
    runtime = OrtModel(path, info).graph.session.get_session_options()
    assert runtime.get_session_config_entry("session.force_spinning_stop") == "1"


@pytest.mark.parametrize(
    ("machine", "flags", "saturates"),
    [
        ("x86_64", "fpu sse2 avx avx2 fma", True),  # the AVX2 EPYC of reports/w8a8_saturation
        ("x86_64", "avx2 avx512f avx512_vnni avx_vnni", False),  # Zen 4/5, Sapphire Rapids
        ("x86_64", "avx2 avx_vnni", False),  # Alder Lake
        ("aarch64", "", False),  # sdot / udot: exact
        ("x86_64", None, True),  # flags unreadable: the exact kernel, slower but right
    ],
)
def test_sessions_ask_for_exact_u8s8_products_where_the_cpu_saturates_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, machine: str, flags: str | None,
    saturates: bool,
) -> None:  # fmt: skip
    """w8a8 graphs hold int8 weights (u8 x s8): on x86 without VNNI every session sets ONNX
    Runtime's exact-kernel option (``onnx_host.EXACT_U8S8``), elsewhere none does; a w8a8 graph
    opens either way (with a weight zero point shared by every MatMulInteger, ORT refused the
    graph under the option) and, wherever its products are exact, gives the same logits."""
    import dataclasses
    import platform

    import numpy as np
    from omnidraft_deploy.exporters.exportable import graph_info
    from omnidraft_deploy.exporters.onnx.fused import build_graph

    from omnidraft_deploy.bundle import graph_contract as gc
    from omnidraft_deploy.catalog.backends import get_recipe
    from omnidraft_deploy.catalog.presets import get_preset
    from omnidraft_deploy.host import onnx_host
    from omnidraft_deploy.reference.model import build_model

    spec = dataclasses.replace(get_preset("tiny-qwen2-7b"), vocab_size=384)
    model = build_model(spec, seed=3, max_seq_len=64)
    with torch.no_grad():
        data = build_graph(model, get_recipe("onnx", "w8a8"), invariant=True).SerializeToString()
    info = graph_info(model, spec, file="target.onnx", quantization="w8a8", seq_len=None)
    ids, pos = np.array([[5, 9, 100, 3, 44, 17]]), gc.contiguous_positions(0, 6)
    onnx_host.u8s8_saturates.cache_clear()
    really_saturates = onnx_host.u8s8_saturates()  # this machine's CPU, before the mock
    plain = gc.ExplicitCacheGraph(onnx_host.cpu_session(data, threads=1), info).run(ids, pos)
    real_read = Path.read_text

    def read_text(self: Path, *args: object, **kwargs: object) -> str:
        if str(self) != "/proc/cpuinfo":
            return real_read(self, *args, **kwargs)  # type: ignore[arg-type]
        if flags is None:
            raise OSError("no /proc here")
        return f"processor\t: 0\nflags\t\t: {flags}\n"

    monkeypatch.setattr(platform, "machine", lambda: machine)
    monkeypatch.setattr(Path, "read_text", read_text)
    onnx_host.u8s8_saturates.cache_clear()
    try:
        assert onnx_host.u8s8_saturates() is saturates
        session = onnx_host.cpu_session(data, threads=1)
        opts = session.get_session_options()
        if saturates:
            assert opts.get_session_config_entry(onnx_host.EXACT_U8S8) == "1"
        else:
            with pytest.raises(RuntimeError, match="does not have configuration"):
                opts.get_session_config_entry(onnx_host.EXACT_U8S8)
        logits = gc.ExplicitCacheGraph(session, info).run(ids, pos)
        if saturates or not really_saturates:  # exact here: the same integer products
            np.testing.assert_array_equal(logits, plain)
    finally:
        onnx_host.u8s8_saturates.cache_clear()
