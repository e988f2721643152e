"""The real pair on ONNX Runtime: exported graphs, drafter configurations, timed methods.

Graphs are exported by the project's ``onnx`` exporter (fused graph; ``int8`` = weight-only
MatMulNBits) and verified against eager PyTorch before use, under the recipe's top-1 criterion
(``verify_graph``: top-1 agreement >= the recipe's ``min_top1``; the max |logit diff| is recorded,
not gated, since greedy decoding only reads the argmax and every output is compared with our ORT
target-only). They are cached under ``.bench/real_pair/`` with their parity. Sessions have
explicit intra-op threads, spinning only inside a call, and their weights on huge pages (``ort_graph``).

Methods (``real_pair.RunFn``): ``ours_target`` (target-only on the ORT target graph);
``ours_<drafter>`` (cost-aware drafting with that drafter, no lookup); ``ours_lookup`` (lookup
drafts only); ``ours_hybrid_<drafter>`` (per step: drafter, lookup or none); ``ours_<drafter>_heur``
(the +2/-1 policy at k = 4, the configuration issue 9 measured at 0.70-0.74x). Every speculative run
also returns the cost model's prediction for its own step trace (``extra``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omnidraft_deploy.protocols import CausalLM
from omnidraft_deploy.speculative.cost import CostProfile, cost_terms, predicted_times
from omnidraft_deploy.speculative.decoder import DecodeConfig, SpeculativeDecoder
from omnidraft_deploy.speculative.draft_len import CostAwareDraftLen, HeuristicDraftLen
from omnidraft_deploy.speculative.hybrid import HybridProposer
from omnidraft_deploy.speculative.lookup import LookupConfig, LookupProposer
from omnidraft_deploy.speculative.stats import DecodeStats
from omnidraft_deploy.vocab.mapper import VocabMapper

log = logging.getLogger(__name__)
ROOT = Path(".bench/real_pair")
TARGET = "qwen2.5-0.5b"
# drafter configuration name -> (how its weights load, drafter tokenizer)
DRAFTERS = {
    "smollm2": ("smollm2-135m", "smollm2"),
    "ee8_before": ("smollm2-ee8:before", "smollm2"),
    "ee8_offline": ("smollm2-ee8", "smollm2"),
    "trained45m": ("trained-llama2-drafter", "llama2"),
}


@dataclass
class TracedStats(DecodeStats):
    extra: dict[str, Any] = field(default_factory=dict)


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
    from omnidraft_deploy.bundle.manifest import GraphInfo
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


def mapper_for(drafter_tok: str, target_tok: Any) -> tuple[VocabMapper, Any]:
    from omnidraft_deploy.vocab.build import build_mapper
    from omnidraft_deploy.vocab.tokenizers import load_tokenizer

    dt = load_tokenizer(drafter_tok)
    return build_mapper(dt, target_tok), dt


def _traced(dec: SpeculativeDecoder, profile: CostProfile) -> Any:
    def run(ids: list[int]) -> tuple[list[int], float, DecodeStats | None]:
        out, st = dec.generate(ids)
        traced = TracedStats(**dataclasses.asdict(st))
        if isinstance(dec.drafter, HybridProposer):
            trace = dec.drafter.trace
            base, spec = predicted_times(profile, trace, len(ids))
            sources = {s: sum(r.source == s for r in trace) for s in ("model", "lookup", "none")}
            terms = {f"cost_{k}": v for k, v in cost_terms(profile, trace, len(ids)).items()}
            traced.extra = {"predicted_base_ms": base, "predicted_spec_ms": spec, **sources,
                            **terms}  # fmt: skip
        return out, st.wall_s, traced

    return run


def spec_methods(target: CausalLM, drafters: dict[str, tuple[CausalLM, VocabMapper]],
                 profiles: dict[str, CostProfile], cfg: DecodeConfig, *, k_max: int = 8,
                 hybrid: tuple[str, ...] = (), heuristic: tuple[str, ...] = ()) -> dict[str, Any]:  # fmt: skip
    """name -> run(prompt ids): every drafter cost-aware, lookup only, hybrids, +2/-1 rows."""
    methods: dict[str, Any] = {}
    any_mapper = next(iter(drafters.values()))[1]

    def lookup() -> LookupProposer:  # per-prompt text only: repeats must not see earlier outputs
        return LookupProposer(LookupConfig(keep_history=False))

    prof0 = profiles[""]
    dec = SpeculativeDecoder(target, None, any_mapper, CostAwareDraftLen(prof0, k_max),
                             config=cfg, lookup=lookup(), profile=prof0)  # fmt: skip
    methods["ours_lookup"] = _traced(dec, prof0)
    for name, (lm, mapper) in drafters.items():
        prof = profiles[name]
        dec = SpeculativeDecoder(target, lm, mapper, CostAwareDraftLen(prof, k_max), config=cfg,
                                 profile=prof)  # fmt: skip
        methods[f"ours_{name}"] = _traced(dec, prof)
        if name in hybrid:
            dec = SpeculativeDecoder(target, lm, mapper, CostAwareDraftLen(prof, k_max),
                                     config=cfg, lookup=lookup(), profile=prof)  # fmt: skip
            methods[f"ours_hybrid_{name}"] = _traced(dec, prof)
        if name in heuristic:
            dec = SpeculativeDecoder(target, lm, mapper, HeuristicDraftLen(4), config=cfg)
            methods[f"ours_{name}_heur"] = _traced(dec, prof)
    return methods
