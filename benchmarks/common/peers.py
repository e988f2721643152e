"""Peer engines timed beside ours on the same prompts: transformers, ONNX Runtime GenAI, llama.cpp.

Each ``*_methods`` / ``*_method`` returns timer methods (``timer.RunFn``: target ids -> new ids,
wall seconds, no stats), greedy, on the same target-vocabulary prompt ids as our rows.

- transformers (``hf_methods``): target-only ``generate`` and its cross-tokenizer assisted
  generation ("universal assisted generation": ``assistant_model`` + ``tokenizer`` +
  ``assistant_tokenizer``), fully offline: models from the safetensors folders
  ``reference.hf_adapter.gguf_to_hf_folder`` caches (the GGUF dequantised once), in fp32;
  tokenizers as ``PreTrainedTokenizerFast`` around the exact ``tokenizers`` objects of
  ``vocab.tokenizers.load_tokenizer`` (transformers' own GGUF tokenizer loading skips Qwen2's NFC);
- ONNX Runtime GenAI (``GenAI``, ``genai_method``): its model builder's graph of the same weights;
- llama.cpp (``llamacpp_method``): ``llama-cpp-python``'s plain decode of the same GGUF.

The peers are imported lazily, with an actionable error where the project declares them.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from omnidraft_deploy.optional import require

log = logging.getLogger(__name__)
MAX_SEQ_LEN = 512  # GenAI's search length (prompt + new tokens)
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
def hf_generate(target: Any, prompt_ids: list[int], *, max_new_tokens: int,
                eos_ids: tuple[int, ...], assist: tuple[Any, Any, Any] | None = None) -> HFRun:  # fmt: skip
    """Greedy ``target.generate`` on target ids (no special handling added), optionally assisted
    across vocabularies: ``assist`` = (drafter, target tokenizer, drafter tokenizer), with which
    transformers picks ``AssistedCandidateGeneratorDifferentTokenizers`` at its default
    draft-length settings."""
    input_ids = torch.tensor([prompt_ids], dtype=torch.long)
    kwargs: dict[str, Any] = {}
    if assist is not None:
        drafter, target_tok, drafter_tok = assist
        kwargs = {"assistant_model": drafter, "tokenizer": target_tok,
                  "assistant_tokenizer": drafter_tok}  # fmt: skip
    t0 = time.perf_counter()
    out = target.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                          do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=list(eos_ids),
                          pad_token_id=eos_ids[0], **kwargs)  # fmt: skip
    wall = time.perf_counter() - t0
    new = [int(t) for t in out[0, len(prompt_ids) :]]
    for i, t in enumerate(new):  # generate pads after EOS; keep EOS like our decoder does
        if t in eos_ids:
            new = new[: i + 1]
            break
    return HFRun(new, wall)


def hf_methods(target: str, drafter: str, *, max_new_tokens: int, eos_ids: tuple[int, ...],
               threads: int) -> dict[str, Any]:  # fmt: skip
    """``hf_target`` and ``hf_assisted`` (``drafter`` assisting) methods, ``threads`` torch
    threads (transformers runs in this process's torch)."""
    torch.set_num_threads(threads)
    t, d = load_hf_model(target), load_hf_model(drafter)
    assist = (d, load_hf_tokenizer(target), load_hf_tokenizer(drafter))

    def method(with_drafter: bool) -> Any:
        def run(ids: list[int]) -> tuple[list[int], float, None]:
            r = hf_generate(t, ids, max_new_tokens=max_new_tokens, eos_ids=eos_ids,
                            assist=assist if with_drafter else None)  # fmt: skip
            return r.new_ids, r.wall_s, None

        return run

    return {"hf_target": method(False), "hf_assisted": method(True)}


class GenAI:
    """ONNX Runtime GenAI: ``append_tokens`` (prefill / verify), ``generate_next_token``."""

    def __init__(self, folder: Path, threads: int) -> None:
        og = require("onnxruntime_genai", extra="bench", purpose="the ONNX Runtime GenAI peer")
        cfg = json.loads((folder / "genai_config.json").read_text())
        opts = cfg["model"]["decoder"].setdefault("session_options", {})
        opts["intra_op_num_threads"] = threads
        (folder / "genai_config.json").write_text(json.dumps(cfg, indent=2))
        self.og, self.model = og, og.Model(str(folder))

    def generator(self, prompt: list[int]) -> Any:
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(max_length=MAX_SEQ_LEN, do_sample=False)
        gen = self.og.Generator(self.model, params)
        gen.append_tokens(prompt)
        return gen

    def decode(self, prompt: list[int], n: int) -> tuple[list[int], float]:
        gen = self.generator(prompt)
        gen.generate_next_token()  # picks from the prefill's logits (ours: the prefill call)
        out, t0 = [int(gen.get_next_tokens()[0])], time.perf_counter()
        for _ in range(n - 1):
            gen.generate_next_token()  # one forward of the last token + greedy pick
            out.append(int(gen.get_next_tokens()[0]))
        return out, time.perf_counter() - t0

    def call(self, ids: list[int], start: int) -> float:
        if start == 0:
            t0 = time.perf_counter()
            self.generator(ids)
            return time.perf_counter() - t0
        if getattr(self, "_ctx", None) != start:
            self._g, self._ctx = self.generator(list(range(3, 3 + start))), start
        self._g.rewind_to(start)
        t0 = time.perf_counter()
        self._g.append_tokens(ids)
        return time.perf_counter() - t0


def genai_method(threads: int, max_new: int, folder: Path) -> Any:
    """ONNX Runtime GenAI's greedy decode of its builder's graph in ``folder`` (a method row)."""
    engine = GenAI(folder, threads)

    def run(ids: list[int]) -> tuple[list[int], float, None]:
        t0 = time.perf_counter()
        gen = engine.generator(ids)
        out: list[int] = []
        while len(out) < max_new and not gen.is_done():
            gen.generate_next_token()
            out.append(int(gen.get_next_tokens()[0]))
        return out, time.perf_counter() - t0, None

    return run


def llama(gguf: Path, threads: int, *, logits_all: bool = False, n_ctx: int = 1024) -> Any:
    """llama.cpp on ``gguf`` as every benchmark here runs it: ``threads`` for decode and batches,
    an ``n_ctx``-token context, prompts in batches of up to 512; ``logits_all`` keeps every row's
    logits in ``scores`` (accuracy checks), not the last one alone."""
    from llama_cpp import Llama

    return Llama(model_path=str(gguf), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                 n_batch=512, logits_all=logits_all, verbose=False)  # fmt: skip


def llamacpp_method(gguf: Path, threads: int, max_new: int, *, keep: int = 0) -> Any:
    """llama.cpp's plain greedy decode of the GGUF (its own sampler at temperature 0); needs
    ``llama-cpp-python``, built from its sdist (``pip install llama-cpp-python==0.3.36``).
    ``keep``: tokens of its context each call may reuse (``generate`` reuses the longest prefix
    its context shares with the prompt, as our ``kv_reuse`` does); 0: every prompt prefilled."""
    llm = llama(gguf, threads)

    def run(ids: list[int]) -> tuple[list[int], float, None]:
        if keep:
            llm.n_tokens = min(llm.n_tokens, keep)
        else:
            llm.reset()
        t0 = time.perf_counter()
        out: list[int] = []
        for tok in llm.generate(ids, temp=0.0, top_k=1, reset=True):
            if tok == llm.token_eos() or len(out) >= max_new:
                break
            out.append(int(tok))
        return out, time.perf_counter() - t0, None

    return run
