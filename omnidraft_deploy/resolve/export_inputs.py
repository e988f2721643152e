"""Every input of ``omnidraft-export``, resolved and checked before the first export step.

``resolve_export`` turns the flags into ``ExportInputs`` or raises ``InputError`` naming the flag
to change, in one plain paragraph. In order (each check costs at most a header read, < 5 s):

1. presets (``--target`` / ``--drafter``) and the output folder (``out_dir.check_out_dir``: a
   non-empty folder that is not one of our bundles, or a bundle holding files its manifest does
   not list, is refused and nothing in it is touched; replacing a bundle needs ``--force``);
2. weights (``--model`` / ``--drafter-model``, else the preset's pinned GGUF or a local copy of
   its hub id; random ``tiny-*`` twins need none): missing files fail here, not after an export;
3. vocabularies: the weights' own architecture, graph rows and tokenizer
   (``vocab.from_weights``) against the preset's tokenizer and family: any disagreement is refused
   naming both sides; graph rows must equal the tokenizer's ids up to documented padding;
4. resources: free disk under ``--out`` and host memory against an estimate.

Weights with no preset (``--model X`` without ``--target``, ``--drafter-model X`` without
``--drafter``) are their own spec (``weights_spec``): architecture, size, context, tokenizer,
special tokens and chat template all come from the files; their tokenizer must equal a registered
one (``vocab.from_weights.registered_tokenizer``), which calibration and verification read.

The tokenizer used for export is the weights' own when they carry one; the preset's otherwise.
"""

from __future__ import annotations

import contextlib
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from omnidraft_deploy.catalog.backends import bytes_per_param
from omnidraft_deploy.catalog.presets import (
    DEFAULT_DRAFTER,
    DEFAULT_TARGET,
    ModelSpec,
    Role,
    Source,
    get_preset,
    list_presets,
)
from omnidraft_deploy.resolve.out_dir import InputError, check_out_dir

if TYPE_CHECKING:  # protocols imports torch; the checks here must not
    from omnidraft_deploy.protocols import TokenizerLike

_FLAGS = {"target": ("--target", "--model"), "drafter": ("--drafter", "--drafter-model")}
EXPORT_PEAK_FACTOR = 2.3  # peak host RSS / fp32 weights, measured (README, Qwen2.5-0.5B ONNX)


@dataclass(frozen=True)
class RoleInputs:
    role: str  # "target" | "drafter"
    spec: ModelSpec
    weights: str | None  # resolved weights path; None: the preset builds its own (random/pretrain)
    tokenizer: TokenizerLike  # the weights' own tokenizer, else the preset's
    graph_rows: int  # embedding rows of the graph
    n_params: int  # estimate, for the resource check
    chat_template: str | None = None
    context: int = 0  # positions the model was made for (its weights' metadata, else the preset)


@dataclass(frozen=True)
class ExportInputs:
    target: RoleInputs
    drafter: RoleInputs
    out_dir: Path
    replaces_bundle: bool  # --force replaces the bundle already at out_dir
    notes: tuple[str, ...] = ()  # one-line warnings worth showing the user


def _hub_snapshot(hub_id: str) -> Path | None:
    """A local snapshot of ``hub_id`` in the Hugging Face cache (no network), or None."""
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", hub_id):
        return None
    try:
        from huggingface_hub import snapshot_download

        path = snapshot_download(hub_id, local_files_only=True, allow_patterns=["*.json"])
    except Exception:  # noqa: BLE001 - any hub error means "not on this machine"
        return None
    return Path(path) if (Path(path) / "config.json").is_file() else None


def resolve_weights(spec: ModelSpec | None, value: str | None, role: str) -> str | None:
    """Path of the weights for ``role`` (``value``, else ``spec``'s); ``InputError`` naming the
    flag when there are none."""
    preset_flag, flag = _FLAGS[role]
    if value is not None:
        path = Path(value).expanduser()
        if path.is_file() and path.suffix == ".gguf" or path.is_dir():
            return str(path)
        if path.exists():
            raise InputError(flag, f"{value} is neither a .gguf file nor a model folder.")
        if (snap := _hub_snapshot(value)) is not None:
            return str(snap)
        raise InputError(
            flag,
            f"{value}: no such file or folder (and not a hub id cached on this machine). Pass the "
            f"{role}'s weights as a Hugging Face folder (config.json + *.safetensors) or a .gguf "
            "file.",
        )
    if spec is None or spec.source in (Source.RANDOM, Source.PRETRAIN):
        return None
    if spec.gguf_asset:
        from omnidraft_deploy.catalog import assets

        try:
            return str(assets.asset_path(spec.gguf_asset))
        except assets.AssetError as e:
            raise InputError(flag, f"{e} Or pass the weights with {flag} PATH.") from None
    if spec.hf_id and (snap := _hub_snapshot(spec.hf_id)) is not None:
        return str(snap)
    twin = f"tiny-{spec.name}"
    raise InputError(
        flag,
        f"{preset_flag} {spec.name} needs its real weights ({spec.hf_id}), which are not on this "
        f"machine, and no model hub is reachable. Pass them with {flag} PATH (a Hugging Face "
        f"folder or a .gguf file)"
        + (f", or use {preset_flag} {twin} for the offline tiny twin." if _exists(twin) else "."),
    )


def _exists(name: str) -> bool:
    try:
        get_preset(name)
    except KeyError:
        return False
    return True


def _matching_presets(model_type: str, rows: int) -> str:
    names = [
        s.name for s in list_presets() if s.family.value == model_type and s.vocab_size == rows
    ]
    return ", ".join(names) if names else "none yet: add one to omnidraft_deploy/catalog/presets.py"


def _refuse_tokenizer(
    flag: str, value: str, spec: ModelSpec, default: bool, theirs: TokenizerLike,
    ours: TokenizerLike, diff: tuple[int, bytes, bytes], model_type: str, rows: int,
) -> InputError:  # fmt: skip
    preset_flag = "--target" if flag == "--model" else "--drafter"
    i, a, b = diff
    return InputError(
        flag,
        f"{value} carries its own {model_type} tokenizer ({theirs.vocab_size} ids), which is not "
        f"the {spec.tokenizer} tokenizer ({ours.vocab_size} ids) of {preset_flag} {spec.name}"
        f"{' (the default)' if default else ''}: token {i} is {a!r} in the weights but {b!r} in "
        f"{spec.tokenizer}. Nothing was exported. Pass {preset_flag} with a preset of this "
        f"vocabulary ({_matching_presets(model_type, rows)}).",
    )


def _preset(role: str, name: str) -> ModelSpec:
    try:
        return get_preset(name)
    except KeyError as e:
        raise InputError(_FLAGS[role][0], str(e.args[0])) from None


def _check_rows(role: str, flag: str, rows: int, tok: TokenizerLike, gguf_rows: int | None) -> None:
    from omnidraft_deploy.vocab.from_weights import padding_allowed

    if not padding_allowed(rows, tok.vocab_size, gguf_pad=gguf_rows == rows):
        raise InputError(
            flag,
            f"the {role} graph has {rows} vocabulary rows but its tokenizer ({tok.name}) defines "
            f"{tok.vocab_size} ids, and no documented padding rule explains the difference "
            "(vocab.from_weights). Pass weights and a preset of the same vocabulary.",
        )


def resolve_role(
    role: str, preset: str, weights_flag: str | None, *, default_preset: bool = False
) -> RoleInputs:
    """Preset + weights + tokenizer of one role, all checked against each other."""
    from omnidraft_deploy.resolve.weights_spec import context_length, n_params
    from omnidraft_deploy.vocab.from_weights import first_difference, read_weights_vocab
    from omnidraft_deploy.vocab.tokenizers import load_tokenizer

    preset_flag, flag = _FLAGS[role]
    spec = _preset(role, preset)
    weights = resolve_weights(spec, weights_flag, role)
    ours: TokenizerLike = load_tokenizer(spec.tokenizer)
    if weights is None:
        rows, tok, template, gguf_rows = spec.vocab_size, ours, None, None
    else:
        try:
            wv = read_weights_vocab(weights)
        except ValueError as e:
            raise InputError(flag, str(e)) from None
        rows, template, gguf_rows = wv.graph_rows, wv.chat_template, wv.listed_ids
        tok = wv.tokenizer or ours
        if wv.tokenizer is not None and (diff := first_difference(wv.tokenizer, ours)):
            raise _refuse_tokenizer(flag, weights_flag or weights, spec, default_preset,
                                    wv.tokenizer, ours, diff, wv.model_type, rows)  # fmt: skip
        if wv.family != spec.family.value:
            raise InputError(
                flag,
                f"{weights_flag or weights} is a {wv.model_type} model, but {preset_flag} "
                f"{spec.name}{' (the default)' if default_preset else ''} is {spec.family.value}. "
                f"Pass {preset_flag} with a preset of this model "
                f"({_matching_presets(wv.family or wv.model_type, wv.graph_rows)}), or leave "
                f"{preset_flag} out to export the weights as they are.",
            )
    _check_rows(role, flag if weights else preset_flag, rows, tok, gguf_rows)
    context = spec.max_seq_len
    if weights is not None:
        with contextlib.suppress(ValueError, KeyError):  # an odd config.json: the preset's
            context = context_length(weights)
    n = n_params(weights) if weights else spec.n_params()
    return RoleInputs(role, spec, weights, tok, rows, n, template, context)


def resolve_own(role: str, weights_flag: str) -> RoleInputs:
    """Weights with no preset: their own spec (``weights_spec``), tokenizer and chat template."""
    from omnidraft_deploy.catalog.tokenizers import IDS
    from omnidraft_deploy.resolve.weights_spec import n_params, read_weights_spec
    from omnidraft_deploy.vocab.from_weights import read_weights_vocab, registered_tokenizer

    preset_flag, flag = _FLAGS[role]
    weights = resolve_weights(None, weights_flag, role)
    assert weights is not None  # a value was given
    try:
        wv = read_weights_vocab(weights)
        if wv.tokenizer is None:
            raise ValueError(
                f"carries no tokenizer (no tokenizer.json / tokenizer.model, no GGUF token table); "
                f"name its vocabulary with {preset_flag} PRESET"
            )
        name = None if Path(weights_flag).expanduser().exists() else weights_flag.split("/")[-1]
        registered = registered_tokenizer(wv.tokenizer)
        if registered is None:
            raise ValueError(
                f"its {wv.model_type} tokenizer ({wv.tokenizer.vocab_size} ids) is none of the "
                f"registered tokenizers ({', '.join(f'{k} {v}' for k, v in IDS.items())}), "
                "which export calibration reads; add it to omnidraft_deploy/vocab/tokenizers.py"
            )
        spec = read_weights_spec(weights, Role(role), tokenizer=registered, name=name)
    except ValueError as e:
        raise InputError(flag, f"{weights_flag}: {str(e).removeprefix(weights + ': ')}") from None
    _check_rows(role, flag, wv.graph_rows, wv.tokenizer, wv.listed_ids)
    return RoleInputs(role, spec, weights, wv.tokenizer, wv.graph_rows, n_params(weights),
                      wv.chat_template, spec.max_seq_len)  # fmt: skip


def _mem_bytes(key: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_resources(out: Path, n_params: int, quantization: str) -> tuple[str, ...]:
    """Refuse when the bundle cannot fit on disk or the export cannot fit in memory (estimates);
    return notes when memory is merely tight. ``n_params``: both graphs together."""
    per_param = bytes_per_param()  # every recipe of backends.RECIPES has its own
    if quantization not in per_param:
        raise InputError("--quantization", f"unknown quantization {quantization!r}; choose from "
                         f"{sorted(per_param)}")  # fmt: skip
    need_disk = n_params * per_param[quantization] * 1.1
    parent = next((p for p in (out, *out.parents) if p.exists()), Path("."))
    free = shutil.disk_usage(parent).free
    if need_disk > free:
        raise InputError("--out", f"the bundle needs about {need_disk / 2**30:.1f} GiB but {parent}"
                         f" has {free / 2**30:.1f} GiB free; choose another --out.")  # fmt: skip
    need_mem = n_params * 4 * EXPORT_PEAK_FACTOR
    total, avail = _mem_bytes("MemTotal"), _mem_bytes("MemAvailable")
    if total is not None and need_mem > total:
        raise InputError("--model", f"exporting needs about {need_mem / 2**30:.0f} GiB of memory "
                         f"(fp32 weights x {EXPORT_PEAK_FACTOR}); this machine has "
                         f"{total / 2**30:.0f} GiB. Use a bigger machine.")  # fmt: skip
    if avail is not None and need_mem > avail:
        return (f"memory is tight: the export may need {need_mem / 2**30:.1f} GiB, "
                f"{avail / 2**30:.1f} GiB is available now",)  # fmt: skip
    return ()


def role_inputs(role: str, preset: str | ModelSpec | None, weights: str | None) -> RoleInputs:
    """One role's inputs: weights alone are their own spec (``resolve_own``); a preset (by name,
    or a spec of ``ExportConfig``) is checked against its weights; neither: the default preset."""
    if isinstance(preset, ModelSpec):
        if preset.source is Source.WEIGHTS and weights is not None:
            return resolve_own(role, weights)
        preset = preset.name
    if preset is None and weights is not None:
        return resolve_own(role, weights)
    default = DEFAULT_TARGET if role == "target" else DEFAULT_DRAFTER
    return resolve_role(role, preset or default, weights, default_preset=preset is None)


def resolve_export(
    *, target: str | ModelSpec | None, drafter: str | ModelSpec | None, model: str | None,
    drafter_model: str | None, out_dir: Path, force: bool, quantization: str,
    reuse_target: bool = False,
) -> ExportInputs:  # fmt: skip
    """All of ``omnidraft-export``'s inputs, checked (module docstring); raises ``InputError``.
    ``target`` / ``drafter`` None: the weights' own spec when weights are given, else the
    default preset. ``reuse_target`` (``--target-from``): only the drafter is exported, so only
    it counts in the memory and disk estimates."""
    replaces = check_out_dir(out_dir, force=force)
    t = role_inputs("target", target, model)
    d = role_inputs("drafter", drafter, drafter_model)
    notes = check_resources(out_dir, d.n_params + (0 if reuse_target else t.n_params), quantization)
    if t.weights is not None and d.spec.source is Source.RANDOM and d.weights is None:
        notes += (f"the drafter {d.spec.name} has random weights: expect no accepted drafts "
                  "with a real target (pass --drafter-model, or --drafter smollm2-135m)",)  # fmt: skip
    return ExportInputs(t, d, out_dir, replaces, notes)
