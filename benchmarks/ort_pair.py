"""The real pair on ONNX Runtime: exported graphs, drafter configurations, timed methods.

Graphs are exported by the project's ``onnx`` exporter (fused graph; ``int8`` = weight-only
MatMulNBits) and verified against eager PyTorch before use, under the recipe's top-1 criterion
(``verify_graph``: top-1 agreement >= the recipe's ``min_top1``; the max |logit diff| is recorded,
not gated, since greedy decoding only reads the argmax and every output is compared with our ORT
target-only). They are cached under ``.bench/real_pair/`` with their parity. Sessions have
explicit intra-op threads, spinning only inside a call, and their weights on huge pages (``ort_graph``).

Methods (``common.timer.RunFn``): ``ours_target`` (target-only on the ORT target graph);
``ours_<drafter>`` (cost-aware drafting with that drafter, no lookup); ``ours_lookup`` (lookup
drafts only); ``ours_hybrid_<drafter>`` (per step: drafter, lookup or none); ``ours_<drafter>_heur``
(the +2/-1 policy at k = 4, the configuration issue 9 measured at 0.70-0.74x). Every speculative run
also returns the cost model's prediction for its own step trace (``extra``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from benchmarks.common.pair import fresh_lookup
from benchmarks.common.timer import RunFn, decoder_run
from omnidraft_deploy.protocols import CausalLM
from omnidraft_deploy.speculative.cost import CostProfile
from omnidraft_deploy.speculative.decoder import DecodeConfig
from omnidraft_deploy.speculative.factory import build_decoder
from omnidraft_deploy.vocab.mapper import VocabMapper

log = logging.getLogger(__name__)
ROOT = Path(".bench/real_pair")
TARGET = "qwen2.5-0.5b"
# drafter configuration name -> how its weights load (``<preset>[:before]``: see ``_eager``)
DRAFTERS = {
    "smollm2": "smollm2-135m",
    "ee8_before": "smollm2-ee8:before",
    "ee8_offline": "smollm2-ee8",
    "trained45m": "trained-llama2-drafter",
}


def _eager(source: str, max_seq_len: int) -> Any:
    from omnidraft_deploy.catalog.presets import get_preset
    from omnidraft_deploy.resolve.load import load_model

    name, _, variant = source.partition(":")
    spec = get_preset(name)
    if variant == "before":
        from omnidraft_deploy.resolve.load import truncated

        return spec, truncated(spec, max_seq_len=max_seq_len)
    return spec, load_model(spec, max_seq_len=max_seq_len)


def early_exit_ready(source: str) -> bool:
    """Whether an early-exit preset's distilled weights are cached (loading would distil)."""
    name, _, variant = source.partition(":")
    if variant == "before" or not name.startswith("smollm2-ee"):
        return True
    from omnidraft_deploy.catalog.assets import cache_root
    from omnidraft_deploy.catalog.presets import get_preset
    from omnidraft_deploy.distill.offline import distilled_path

    return distilled_path(get_preset(name), Path(cache_root())).is_file()


def with_accuracy_level(src: Path, dst: Path, level: int) -> None:
    """Copy of the graph ``src`` whose ``MatMulNBits`` nodes compute at ``accuracy_level`` ``level``
    (0/1: fp32 activations, 4: int8 activations; the exporter writes 4)."""
    import onnx

    proto = onnx.load(str(src))
    for node in proto.graph.node:
        if node.op_type == "MatMulNBits":
            kept = [a for a in node.attribute if a.name != "accuracy_level"]
            del node.attribute[:]
            node.attribute.extend([*kept, onnx.helper.make_attribute("accuracy_level", level)])
    onnx.save(proto, str(dst))


def parse_quant(quant: str) -> tuple[str, int | None, bool]:
    """``<recipe>[-acc<n>][-inv]`` -> (recipe, MatMulNBits accuracy level or None, invariant):
    ``-acc<n>`` rewrites the graph's ``MatMulNBits`` to accuracy level ``n``; ``-inv`` exports
    the fused graph with batch-invariant attention (``exporters.onnx_invariant``)."""
    rest, invariant = (quant[: -len("-inv")], True) if quant.endswith("-inv") else (quant, False)
    base, _, level = rest.partition("-acc")
    return base, int(level) if level else None, invariant


def verify_graph(source: str, role: str, quant: str, *, max_seq_len: int = 512,
                 root: Path = ROOT) -> tuple[Path, Any, dict[str, Any]]:  # fmt: skip
    """Export (cached) and verify one graph: (path, GraphInfo, parity). ``quant``: see
    ``parse_quant``. A cached graph is reused with its parity and ``GraphInfo`` (no eager model
    is loaded)."""
    from omnidraft_deploy.bundle.sections import GraphInfo
    from omnidraft_deploy.catalog.backends import get_recipe

    out = root / f"{source.replace(':', '-')}-{quant}"
    recipe = get_recipe("onnx", parse_quant(quant)[0])
    parity_file, info_file = out / "parity.json", out / "info.json"
    if parity_file.is_file() and not info_file.is_file():  # cached before info.json was kept
        info_file.write_text(_graph_info_json(out / f"{role}.onnx"))
    if not (parity_file.is_file() and info_file.is_file()):
        info = _export_and_verify(source, role, quant, out, max_seq_len)
        info_file.write_text(json.dumps(dataclasses.asdict(info), indent=1))
    info = GraphInfo(**json.loads(info_file.read_text()))
    parity = json.loads(parity_file.read_text())
    if parity["top1_agreement"] < recipe.min_top1:
        raise ValueError(f"{out}: top-1 agreement {parity['top1_agreement']} < {recipe.min_top1}")
    return out / info.file, info, parity


def _graph_info_json(path: Path) -> str:
    """The ``GraphInfo`` the exporter wrote into the graph's ``metadata_props``."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    return {p.key: p.value for p in proto.metadata_props}["omnidraft.graph_info"]


def _export_and_verify(source: str, role: str, quant: str, out: Path, max_seq_len: int) -> Any:
    from omnidraft_deploy.exporters import get_exporter
    from omnidraft_deploy.exporters.exportable import graph_info
    from omnidraft_deploy.exporters.verify import verify_artifact

    from omnidraft_deploy.catalog.backends import get_recipe

    spec, model = _eager(source, max_seq_len)
    base, level, invariant = parse_quant(quant)
    recipe = get_recipe("onnx", base)
    info = graph_info(model, spec, file=f"{role}.onnx", quantization=base, seq_len=None)
    parity_file = out / "parity.json"
    if not parity_file.is_file():
        out.mkdir(parents=True, exist_ok=True)
        info, _ = get_exporter("onnx")(model, spec, out, role=role, recipe=recipe, draft_len=4,
                                       eos_ids=(), invariant=invariant)  # fmt: skip
        if level is not None:
            with_accuracy_level(out / info.file, out / info.file, level)
        top1 = dataclasses.replace(recipe, tolerance=float("inf"))
        parity = verify_artifact(out / info.file, info, model, top1)
        parity_file.write_text(json.dumps(parity, indent=1))
    return info


def ort_graph(path: Path, info: Any, threads: int) -> CausalLM:
    """``OrtModel`` with explicit threads and its pools spinning only inside a call (target and
    drafter sessions alternate on the same cores), its weights on huge pages as ``OrtModel`` puts them by default
    (``omnidraft_deploy.hugepages``; 10-13% faster decoding here, both roles)."""
    from omnidraft_deploy.runtime.onnxruntime_model import OrtModel

    return OrtModel(path, info, threads=threads)


def spec_methods(target: CausalLM, drafters: dict[str, tuple[CausalLM, VocabMapper]],
                 profiles: dict[str, CostProfile], cfg: DecodeConfig, *, k_max: int = 8,
                 hybrid: tuple[str, ...] = (), heuristic: tuple[str, ...] = ()) -> dict[str, RunFn]:  # fmt: skip
    """name -> run(prompt ids): every drafter cost-aware, lookup only, hybrids, +2/-1 rows."""
    any_mapper = next(iter(drafters.values()))[1]
    prof0 = profiles[""]
    dec = build_decoder(target, None, any_mapper, config=cfg, policy="cost",
                        draft_len=k_max // 2, profile=prof0, lookup=fresh_lookup())  # fmt: skip
    methods = {"ours_lookup": decoder_run(dec, profile=prof0)}
    for name, (lm, mapper) in drafters.items():
        prof = profiles[name]
        for row, look in ((f"ours_{name}", False), (f"ours_hybrid_{name}", True)):
            if look and name not in hybrid:
                continue
            dec = build_decoder(target, lm, mapper, config=cfg, policy="cost",
                                draft_len=k_max // 2, profile=prof,
                                lookup=fresh_lookup() if look else None)  # fmt: skip
            methods[row] = decoder_run(dec, profile=prof)
        if name in heuristic:
            dec = build_decoder(target, lm, mapper, config=cfg, policy="heuristic", draft_len=4)
            methods[f"ours_{name}_heur"] = decoder_run(dec, profile=prof)
    return methods
