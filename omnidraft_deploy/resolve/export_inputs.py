"""Every input of ``omnidraft-export``, resolved and checked before the first export step.

``resolve_export`` turns the flags into ``ExportInputs`` or raises ``InputError`` naming the flag
to change, in one plain paragraph. In order (each check costs at most a header read, < 5 s):

1. presets (``--target`` / ``--drafter``) and the output folder (``check_out_dir``: a non-empty
   folder that is not one of our bundles is refused, nothing in it is touched; replacing a bundle
   needs ``--force``);
2. weights (``--model`` / ``--drafter-model``, else the preset's pinned GGUF or a local copy of
   its hub id; random ``tiny-*`` twins need none): missing files fail here, not after an export;
3. vocabularies: the weights' own architecture, graph rows and tokenizer
   (``vocab.from_weights``) against the preset's tokenizer and family: any disagreement is refused
   naming both sides; graph rows must equal the tokenizer's ids up to documented padding;
4. resources: free disk under ``--out`` and host memory against an estimate.

The tokenizer used for export is the weights' own when they carry one; the preset's otherwise.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from omnidraft_deploy.catalog.backends import bytes_per_param
from omnidraft_deploy.catalog.presets import ModelSpec, Source, get_preset, list_presets

if TYPE_CHECKING:  # protocols imports torch; the checks here must not
    from omnidraft_deploy.protocols import TokenizerLike

_FLAGS = {"target": ("--target", "--model"), "drafter": ("--drafter", "--drafter-model")}
EXPORT_PEAK_FACTOR = 2.3  # peak host RSS / fp32 weights, measured (README, Qwen2.5-0.5B ONNX)


class InputError(ValueError):
    """A flag's value cannot be used; ``str()`` is one paragraph naming the flag."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}")
        self.flag = flag


@dataclass(frozen=True)
class RoleInputs:
    role: str  # "target" | "drafter"
    spec: ModelSpec
    weights: str | None  # resolved weights path; None: the preset builds its own (random/pretrain)
    tokenizer: TokenizerLike  # the weights' own tokenizer, else the preset's
    graph_rows: int  # embedding rows of the graph
    n_params: int  # estimate, for the resource check
    chat_template: str | None = None


@dataclass(frozen=True)
class ExportInputs:
    target: RoleInputs
    drafter: RoleInputs
    out_dir: Path
    replaces_bundle: bool  # --force replaces the bundle already at out_dir
    notes: tuple[str, ...] = ()  # one-line warnings worth showing the user


def check_out_dir(out: Path, *, force: bool) -> bool:
    """Refuse a non-empty ``out`` that is not our bundle, or a bundle without ``force``.

    Returns True when ``out`` holds a bundle that the export will replace. Never modifies ``out``.
    """
    from omnidraft_deploy.bundle.manifest import FORMAT_NAME, MANIFEST_NAME

    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise InputError("--out", f"{out} exists and is not a folder; choose a new folder.")
    if not out.exists() or not any(out.iterdir()):
        return False
    try:  # ours: a manifest of our format (even a damaged or newer bundle of ours)
        manifest = json.loads((out / MANIFEST_NAME).read_text(encoding="utf-8"))
        ours = isinstance(manifest, dict) and manifest.get("format") == FORMAT_NAME
    except (OSError, ValueError):
        ours = False
    if not ours:
        names = sorted(p.name for p in out.iterdir())
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        raise InputError(
            "--out",
            f"{out} is not empty ({len(names)} entries: {shown}) and is not an omnidraft bundle; "
            "nothing in it was touched. Choose a new or empty folder for --out.",
        )
    if not force:
        raise InputError(
            "--out",
            f"{out} already holds a {manifest.get('backend')} bundle; pass --force to replace it "
            "(the old one stays in place until the new one is complete), or choose another --out.",
        )
    return True


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


def resolve_weights(spec: ModelSpec, value: str | None, role: str) -> str | None:
    """Path of the weights for ``role``; ``InputError`` naming the flag when there are none."""
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
    if spec.source in (Source.RANDOM, Source.PRETRAIN):
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


def resolve_role(
    role: str, preset: str, weights_flag: str | None, *, default_preset: bool = False
) -> RoleInputs:
    """Preset + weights + tokenizer of one role, all checked against each other."""
    from omnidraft_deploy.vocab.from_weights import (
        first_difference,
        padding_allowed,
        read_weights_vocab,
    )
    from omnidraft_deploy.vocab.tokenizers import load_tokenizer

    preset_flag, flag = _FLAGS[role]
    try:
        spec = get_preset(preset)
    except KeyError as e:
        raise InputError(preset_flag, str(e.args[0])) from None
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
                f"({_matching_presets(wv.family or wv.model_type, wv.graph_rows)}).",
            )
    if not padding_allowed(rows, tok.vocab_size, gguf_pad=gguf_rows == rows):
        raise InputError(
            flag if weights else preset_flag,
            f"the {role} graph has {rows} vocabulary rows but its tokenizer ({tok.name}) defines "
            f"{tok.vocab_size} ids, and no documented padding rule explains the difference "
            "(vocab.from_weights). Pass weights and a preset of the same vocabulary.",
        )
    n_params = _n_params(weights) if weights else spec.n_params()
    return RoleInputs(role, spec, weights, tok, rows, n_params, template)


def _n_params(weights: str) -> int:
    """Parameter count from the weights' headers (GGUF tensor infos / safetensors headers)."""
    import math
    import struct

    path = Path(weights)
    if path.suffix == ".gguf":
        from omnidraft_deploy.vocab.gguf_meta import read_gguf_header

        return sum(math.prod(d) for d in read_gguf_header(path).tensors.values())
    total = 0
    for f in sorted(path.glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(min(n, 1 << 26)))
        total += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
    return total


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


def resolve_export(
    *, target: str, drafter: str, model: str | None, drafter_model: str | None, out_dir: Path,
    force: bool, quantization: str, default_target: bool = False, default_drafter: bool = False,
) -> ExportInputs:  # fmt: skip
    """All of ``omnidraft-export``'s inputs, checked (module docstring); raises ``InputError``."""
    replaces = check_out_dir(out_dir, force=force)
    t = resolve_role("target", target, model, default_preset=default_target)
    d = resolve_role("drafter", drafter, drafter_model, default_preset=default_drafter)
    notes = check_resources(out_dir, t.n_params + d.n_params, quantization)
    if t.weights is not None and d.spec.source is Source.RANDOM and d.weights is None:
        notes += (f"the drafter {d.spec.name} has random weights: expect no accepted drafts "
                  "with a real target (pass --drafter-model, or --drafter smollm2-135m)",)  # fmt: skip
    return ExportInputs(t, d, out_dir, replaces, notes)
