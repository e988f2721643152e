"""The one model loader: a resolved preset (plus an optional weights path) -> eager ``Transformer``.

Every verb, exporter, runtime validation, distillation run and benchmark gets its eager models here;
``tests/core/test_layering.py`` fails when another module calls the sources below directly.
Resolve a preset name once per command (``presets.get_preset``) and pass the ``ModelSpec`` on.

Sources (``ModelSpec.source``; ``weights`` overrides the preset's own):

- ``weights`` given: a Hugging Face folder or a ``.gguf`` file (``reference.hf_adapter``; a GGUF is
  dequantised once and a safetensors copy cached), checked against the preset's architecture;
- ``random``: ``reference.model.build_model`` from ``seed`` (the tiny twins of the fast tests);
- ``hf`` / ``gguf``: the preset's hub id or pinned GGUF asset (``hf_adapter.load_preset_weights``);
- ``pretrain``: ``distill.pretrain.load_pretrained``, trained on first use and cached keyed by
  config + corpus hash.
- ``early_exit``: ``distill.offline.load_early_exit``: the parent's first layers (``truncated``),
  distilled against the target on first use and cached keyed by recipe + corpus hash. This loader
  hands both models to distill, which never imports it back (arrows run one way).
"""

from __future__ import annotations

from omnidraft_deploy.catalog.presets import ModelSpec, Source, get_preset
from omnidraft_deploy.protocols import CausalLM
from omnidraft_deploy.reference.model import Transformer


def load_model(
    spec: ModelSpec, *, seed: int = 0, max_seq_len: int | None = None, weights: str | None = None
) -> Transformer:
    """Eager fp32 model of ``spec`` in eval mode; ``max_seq_len`` sizes its KV cache (default:
    the preset's). ``seed`` matters only for ``random`` presets."""
    if weights is not None:
        from omnidraft_deploy.reference.hf_adapter import load_model as load_weights

        model = load_weights(weights, max_seq_len=max_seq_len)[0]
        _check_arch(spec, model, weights)
        return model
    if spec.source is Source.WEIGHTS:
        raise ValueError(f"{spec.name} was read from weights the caller did not pass: pass weights")
    if spec.source is Source.RANDOM:
        from omnidraft_deploy.reference.model import build_model

        return build_model(spec, seed=seed, max_seq_len=max_seq_len)
    if spec.source is Source.PRETRAIN:
        from omnidraft_deploy.distill.pretrain import load_pretrained

        return load_pretrained(spec, max_seq_len=max_seq_len or spec.max_seq_len)
    if spec.source is Source.EARLY_EXIT:
        from omnidraft_deploy.distill.offline import load_early_exit, recipe_of

        target = get_preset(recipe_of(spec).target)
        return load_early_exit(spec, truncated(spec, max_seq_len=max_seq_len),
                               load_target=lambda n: load_model(target, max_seq_len=n))  # fmt: skip
    from omnidraft_deploy.reference.hf_adapter import load_preset_weights

    return load_preset_weights(spec.name, max_seq_len=max_seq_len)[0]


def load_lm(
    spec: ModelSpec, *, seed: int = 0, max_seq_len: int | None = None, weights: str | None = None
) -> CausalLM:
    """``load_model`` behind the ``CausalLM`` protocol (the eager reference runtime)."""
    from omnidraft_deploy.reference.torch_lm import EagerLM

    return EagerLM(load_model(spec, seed=seed, max_seq_len=max_seq_len, weights=weights))


def truncated(spec: ModelSpec, *, max_seq_len: int | None = None) -> Transformer:
    """The early-exit drafter before any distillation: the parent's first ``n_layers``."""
    from omnidraft_deploy.distill.offline import recipe_of
    from omnidraft_deploy.reference.truncate import truncate_layers

    parent = load_model(get_preset(recipe_of(spec).parent), max_seq_len=max_seq_len)
    return truncate_layers(parent, spec.n_layers, max_seq_len=max_seq_len or spec.max_seq_len)


def _check_arch(spec: ModelSpec, model: Transformer, weights: str) -> None:
    """A weights file must fit the preset it stands in for (vocabulary and tokenizer follow it)."""
    if model.args.vocab_size != spec.vocab_size:
        raise ValueError(
            f"{weights}: {model.args.vocab_size} embedding rows, but preset {spec.name!r} "
            f"(tokenizer {spec.tokenizer}) has {spec.vocab_size}: pass the matching --target/--drafter"
        )
