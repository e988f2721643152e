"""transformers' own decoding on the real pair: the peer baseline for cross-vocabulary speedups.

Builds Hugging Face models and tokenizers for the two pinned GGUF assets fully offline:
- models from the safetensors folders ``reference.hf_adapter.gguf_to_hf_folder`` caches (the GGUF
  is dequantised once; later loads read safetensors), in fp32;
- tokenizers as ``PreTrainedTokenizerFast`` wrapping the exact ``tokenizers`` objects of
  ``vocab.tokenizers.load_tokenizer`` (transformers' own GGUF tokenizer loading is not exact for
  Qwen2: it skips NFC; see ``vocab/tokenizers.py``).

``hf_generate`` runs target-only greedy decoding (``drafter=None``) or transformers' cross-tokenizer
assisted generation ("universal assisted generation": ``assistant_model`` + ``tokenizer`` +
``assistant_tokenizer``, greedy) on a list of target ids and times it. ``transformers`` is imported
lazily; this is an edge module (tokenizers appear here because HF's path needs them).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from omnidraft_deploy.optional import require

log = logging.getLogger(__name__)

# name -> (pinned GGUF asset, our tokenizer name)
HF_MODELS: dict[str, tuple[str, str]] = {
    "smollm2-135m": ("smollm2-135m-gguf", "smollm2"),
    "qwen2.5-0.5b": ("qwen2.5-0.5b-gguf", "qwen2"),
}


@dataclass(frozen=True)
class HFRun:
    """One timed ``generate`` call: new target ids (EOS kept if hit) and wall-clock seconds."""

    new_ids: list[int]
    wall_s: float

    @property
    def tokens_per_s(self) -> float:
        return len(self.new_ids) / self.wall_s if self.wall_s else 0.0


def _transformers() -> Any:
    return require("transformers", extra="hf", purpose="the transformers baseline")


def _lookup(name: str) -> tuple[str, str]:
    try:
        return HF_MODELS[name]
    except KeyError:
        raise KeyError(
            f"unknown HF baseline model {name!r}; choose from {sorted(HF_MODELS)}"
        ) from None


def load_hf_model(name: str) -> Any:
    """fp32 eval-mode ``AutoModelForCausalLM`` for ``name`` (see ``HF_MODELS``), offline.

    Raises ``assets.AssetError`` naming the fetch command when the GGUF asset is not cached.
    """
    from omnidraft_deploy.catalog.assets import asset_path
    from omnidraft_deploy.reference.hf_adapter import gguf_to_hf_folder

    asset, _ = _lookup(name)
    folder, _ = gguf_to_hf_folder(asset_path(asset))
    model = _transformers().AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.float32, local_files_only=True
    )
    return model.eval()


def load_hf_tokenizer(name: str) -> Any:
    """``PreTrainedTokenizerFast`` around our exact tokenizer for ``name`` (EOS/pad set)."""
    from omnidraft_deploy.vocab.tokenizers import load_tokenizer

    _, tok_name = _lookup(name)
    ours = load_tokenizer(tok_name)
    inner = getattr(ours, "_tok", None)
    if inner is None:
        raise TypeError(f"tokenizer {tok_name!r} is not tokenizers-based; cannot wrap it for HF")
    eos = ours.eos_ids[0]
    eos_text = inner.id_to_token(eos)
    return _transformers().PreTrainedTokenizerFast(
        tokenizer_object=inner, eos_token=eos_text, pad_token=eos_text
    )


@torch.inference_mode()
def hf_generate(
    target: Any,
    prompt_ids: list[int],
    *,
    max_new_tokens: int,
    eos_ids: tuple[int, ...],
    drafter: Any = None,
    target_tok: Any = None,
    drafter_tok: Any = None,
) -> HFRun:
    """Greedy ``target.generate`` on target ids, optionally with a cross-tokenizer drafter.

    prompt_ids: target-vocabulary ids (no special handling added). With ``drafter`` set, both
    tokenizers are required and transformers picks ``AssistedCandidateGeneratorDifferentTokenizers``
    (greedy universal assisted generation) with its default draft-length settings.
    """
    if drafter is not None and (target_tok is None or drafter_tok is None):
        raise ValueError("assisted generation across vocabularies needs both tokenizers")
    input_ids = torch.tensor([prompt_ids], dtype=torch.long)
    kwargs: dict[str, Any] = {}
    if drafter is not None:
        kwargs = {"assistant_model": drafter, "tokenizer": target_tok,
                  "assistant_tokenizer": drafter_tok}  # fmt: skip
    t0 = time.perf_counter()
    out = target.generate(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=list(eos_ids),
        pad_token_id=eos_ids[0],
        **kwargs,
    )
    wall = time.perf_counter() - t0
    new = [int(t) for t in out[0, len(prompt_ids) :]]
    for i, t in enumerate(new):  # generate pads after EOS; keep EOS like our decoder does
        if t in eos_ids:
            new = new[: i + 1]
            break
    return HFRun(new, wall)
