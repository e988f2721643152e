"""``omnidraft adapt BUNDLE``, the runtime half: adapt a bundle's drafter to the user's prompts.

The bundle's target graph verifies (ONNX Runtime / ExecuTorch / QNN, as ``run`` uses it); the
drafter drafts in eager PyTorch (``resolve.load``, from the bundle's drafter preset) because its
weights change after every prompt; the loop is ``distill.adapt.adapt_stream``. The n-gram cache
the stream grows is the bundle's session cache (``run`` starts from it next time). Swapping the
adapted weights into the bundle's drafter graph is the exporters' job (``omnidraft adapt`` passes
it as ``publish``): this module never writes a graph.

A target of a multi-target bundle (``target``, with its state folder ``state``) is adapted the
same way, on that target's traffic; its drafter starts from the weights it was last adapted to
(``runtime.adapted``: kept in ``state``, published there by ``publish_target_weights``), else from
the preset's, and the drafter graph must be swappable (``check_swappable``), which is checked
before any training.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from omnidraft_deploy.runtime.adapted import (
    adapted_weights,
    check_swappable,
    distilled_weights,
    resume,
)
from omnidraft_deploy.runtime.bundle import OpenBundle, open_bundle

from omnidraft_deploy.bundle.drafter_weights import ADAPTED_DRAFTER, DISTILLED_DRAFTER
from omnidraft_deploy.catalog.presets import PRESETS, get_preset
from omnidraft_deploy.distill.adapt import AdaptConfig, AdaptReport, adapt_stream, make_distiller
from omnidraft_deploy.reference.model import Transformer
from omnidraft_deploy.reference.torch_lm import EagerLM
from omnidraft_deploy.resolve.load import load_model
from omnidraft_deploy.speculative.decoder import DecodeConfig
from omnidraft_deploy.speculative.factory import build_decoder


@dataclass(frozen=True)
class BundleAdaptation:
    drafter: Transformer  # the adapted eager drafter
    report: AdaptReport  # acceptance per prompt while adapting (all rounds, in order)
    rounds: int


def starting_drafter(bundle: OpenBundle, state: Path | None) -> Transformer:
    """The eager drafter ``adapt`` and ``distill`` train: the bundle's drafter preset's weights,
    then, from the state folder ``state``, a multi-target bundle's target's adapted weights
    (``runtime.adapted``) or a single-target bundle's distilled ones (``runtime.adapted.save_distilled``), when
    they were published for this very drafter graph. A multi-target bundle's drafter graph must
    take swapped weights (``check_swappable``): checked here, before any training."""
    if bundle.manifest.targets:
        check_swappable(bundle.manifest, bundle.root)
    info = bundle.manifest.graphs["drafter"]
    seed = bundle.manifest.extras.get("seed")
    if info.preset not in PRESETS:
        raise ValueError(
            f"{bundle.root}: the drafter {info.preset!r} was exported from its own weights, "
            "which the bundle does not carry; adapt and distill start from a drafter preset's "
            "weights (export with --drafter PRESET)"
        )
    drafter = load_model(
        get_preset(info.preset),
        seed=(seed if type(seed) is int else 0) + 1,  # export seeds the drafter with seed + 1
        max_seq_len=info.max_seq_len,
    )
    if state is None:
        return drafter
    found = adapted_weights(bundle.root, bundle.manifest, state), ADAPTED_DRAFTER
    if found[0] is None:
        found = distilled_weights(bundle.manifest, state), DISTILLED_DRAFTER
    if found[0] is not None:
        resume(drafter, found[0], state / found[1])
    return drafter


def adapt_bundle(
    bundle_dir: str | Path,
    prompts: Sequence[list[int]],
    cfg: AdaptConfig,
    *,
    rounds: int = 1,
    max_new_tokens: int = 32,
    provider: str | None = None,
    publish: Callable[[Transformer], None] | None = None,
    target: str | None = None,
    state: Path | None = None,
) -> BundleAdaptation:
    """Stream ``prompts`` (target ids) ``rounds`` times through the bundle, learning after each.

    The drafter starts from its preset's weights (the bundle's ``extras`` are informational, never
    loaded), or, for ``target`` of a multi-target bundle, from its adapted weights in its state
    folder ``state`` (module docstring); ``publish`` receives the adapted drafter once, after the
    last prompt.
    """
    if rounds < 1 or not prompts:
        raise ValueError(f"need rounds >= 1 and at least one prompt, got {rounds}, {len(prompts)}")
    bundle = open_bundle(bundle_dir, provider=provider, target=target)
    drafter = starting_drafter(bundle, state)
    distiller = make_distiller(drafter, bundle.mapper, cfg)
    decoder = build_decoder(
        bundle.target, EagerLM(drafter), bundle.mapper, policy="heuristic",
        draft_len=bundle.manifest.draft_len, config=DecodeConfig(max_new_tokens=max_new_tokens),
        ngram_cache=bundle.ngram_cache,
    )  # fmt: skip
    stream = [p for _ in range(rounds) for p in prompts]
    report = adapt_stream(decoder, distiller, stream, publish=publish)
    return BundleAdaptation(drafter, report, rounds)
