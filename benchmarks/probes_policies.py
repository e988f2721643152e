"""Draft-length policies A/B on a bundle (``python -m benchmarks.probes_1p5b policies``).

``current`` is the shipped ``CostAwareDraftLen``; the others undo its two changes of issue 26:
``lookahead`` values a token at target-only's cost (``profile.value_ms``) and ``myopic`` also
decides on the next draft alone (``marginal_ms``), as the policy did before.
"""

from __future__ import annotations

import argparse
import collections
from typing import Any

import numpy as np
from omnidraft_deploy.runtime.bundle import open_bundle

import benchmarks.real_pair_bundle as rpb
from benchmarks.common.pair import prompt_texts
from benchmarks.common.timer import decoder_run, target_run
from omnidraft_deploy.speculative.cost import marginal_ms
from omnidraft_deploy.speculative.decoder import DecodeConfig
from omnidraft_deploy.speculative.draft_len import AcceptancePredictorDraftLen, CostAwareDraftLen
from omnidraft_deploy.speculative.factory import pair_config
from omnidraft_deploy.vocab.bundle_tokenizer import load_bundle_tokenizer, render_chat


class Lookahead(CostAwareDraftLen):
    @property
    def value(self) -> float:
        return self.profile.value_ms


class Myopic(Lookahead):
    def first_pays(self) -> bool:
        return self.rate * self.value > marginal_ms(self.profile, 0, model=True)

    def keep_drafting(self, i: int, features: np.ndarray) -> bool:
        AcceptancePredictorDraftLen.keep_drafting(self, i, features)
        return self._survive * self.rate * self.value > marginal_ms(self.profile, i + 1, model=True)


POLICIES: dict[str, type[CostAwareDraftLen]] = {
    "myopic": Myopic, "lookahead": Lookahead, "current": CostAwareDraftLen,
}  # fmt: skip


def compare_policies(a: argparse.Namespace) -> dict[str, Any]:
    b = open_bundle(a.bundle, threads=a.threads[0])
    prof = rpb._profiles(b, None, 5)["smollm2"]
    tok = load_bundle_tokenizer(b.root, "target", b.manifest.files)
    cfg = pair_config(b.mapper, DecodeConfig(max_new_tokens=a.max_new_tokens, host_threads=1))
    raw = prompt_texts(code_edit=True)
    template = getattr(tok, "chat_template", None)
    prompts = [(t, tok.encode(render_chat(template, q["text"])))
               for t in a.tasks.split(",") for q in [r for r in raw if r["task"] == t][: a.per_task]]  # fmt: skip
    runs = {}
    for name in a.policies.split(","):
        dec = rpb._decoder(b, prof, cfg, model=True, lookup=False)
        hybrid: Any = dec.drafter
        hybrid.model.policy.__class__ = POLICIES[name]  # same state, another rule
        runs[name] = decoder_run(dec, profile=prof)
    base = target_run(b.target, cfg)
    tot: dict[str, float] = collections.defaultdict(float)
    same: dict[str, int] = collections.defaultdict(int)
    for _task, ids in prompts:
        ref, wall, _ = base(ids)
        tot["base"] += wall
        for name, run in runs.items():
            out, w, stats = run(ids)
            st: Any = stats
            tot[name] += w
            tot[f"{name} modelled base"] += st.extra["predicted_base_ms"]
            tot[f"{name} modelled"] += st.extra["predicted_spec_ms"]
            same[name] += out == ref
    res: dict[str, Any] = {}
    for name in runs:
        res[f"{name}: measured speedup"] = tot["base"] / tot[name]
        res[f"{name}: modelled speedup"] = tot[f"{name} modelled base"] / tot[f"{name} modelled"]
        res[f"{name}: identical"] = f"{same[name]}/{len(prompts)}"
    return res
