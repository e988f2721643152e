"""Bundle writer: drafter + target graphs, the caller's files (tokenizers, vocabulary map, n-gram
cache, ``expected.json``), manifest. ``omnidraft-export`` is ``exporters.export.export_pair``,
which builds those files and calls this.

``export_bundle(cfg, ...)`` loads each model once with ``reference.load`` (the one
loader: random twins from ``cfg.seed``, trained, GGUF or HF weights, or the ``*_model`` paths), writes each graph
with the backend's recipe from the ``EXPORTERS`` registry, verifies every written graph (reload +
compare with eager PyTorch: ``exporters.verify``, or the caller's ``verify``; the figures go into
``GraphInfo.parity``), copies tokenizer files and the caller's extra files (``vocab_map.bin``,
``ngram_cache.bin``), hashes every file into ``manifest.json``, lets the caller's ``opener``
open the staged bundle and renames the folder into place last (``manifest.atomic_bundle_dir``): an interrupted or failed export leaves no folder that looks
complete, and an existing bundle at ``out_dir`` stays untouched until the new one is whole.

Manifest ``extras``: ``seed``, ``target_model``/``drafter_model`` (what the weights are:
``resolve.weights_spec.weights_record``, name, size, architecture, file name and sha256, never a
path; None for a preset's own weights), and per role ``stages``
(seconds and peak host RSS in MiB of load / export / verify) plus the backend's own facts (XNNPACK
op coverage, ``.ort`` file).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omnidraft_deploy.exporters import get_exporter
from omnidraft_deploy.exporters.memory import stage
from tqdm import tqdm

from omnidraft_deploy.bundle.atomic import write_bytes_atomic, write_text_atomic
from omnidraft_deploy.bundle.files import file_entry
from omnidraft_deploy.bundle.folder import atomic_bundle_dir
from omnidraft_deploy.bundle.manifest import HTP_CONTEXT, Manifest
from omnidraft_deploy.bundle.sections import GraphInfo
from omnidraft_deploy.catalog.backends import Backend, get_backend, get_recipe
from omnidraft_deploy.catalog.presets import ModelSpec, get_preset
from omnidraft_deploy.checks.expected import EXPECTED_FILE, EXPECTED_ROLE
from omnidraft_deploy.reference.model import Transformer
from omnidraft_deploy.resolve.load import load_model

log = logging.getLogger(__name__)
# verify(written graph path, its GraphInfo, eager fp32 model) -> parity dict (raises on failure)
Verify = Callable[[Path, GraphInfo, Transformer], dict[str, float]]
# derived files (staging folder, role -> GraphInfo, eager target) -> {rel: (bytes, manifest role)}
Derived = Callable[[Path, dict[str, GraphInfo], Transformer], dict[str, tuple[bytes, str]]]
ROLES = ("drafter", "target")  # export order: the target last


@dataclass(frozen=True)
class ExportConfig:
    """What ``omnidraft-export`` asks for; every field maps to one CLI flag."""

    # target preset name (`omnidraft presets`), e.g. tiny-llama3-8b, qwen2.5-0.5b, or the spec
    # of weights with no preset (``resolve.weights_spec``: ``ExportInputs.target.spec``)
    target: str | ModelSpec
    drafter: str | ModelSpec = "tiny-llama-68m"  # drafter preset name or spec
    backend: str = "xnnpack"  # xnnpack (.pte) | onnx (.onnx + .ort) | qnn (static-T QDQ .onnx)
    quantization: str = "fp32"  # per backend, see backends.RECIPES / recipe_names()
    drafter_quantization: str | None = None  # the drafter's recipe when not ``quantization``
    out_dir: Path = Path("bundles/default")  # final bundle folder (replaced atomically)
    max_seq_len: int = 512  # KV-cache slots of both graphs (prompt + generated tokens)
    draft_len: int = 4  # drafter proposals per step; static T of NPU graphs is draft_len + 1
    target_model: str | None = None  # HF folder / .gguf for real weights; None: preset's source
    drafter_model: str | None = None  # same for the drafter
    seed: int = 0  # random init of tiny presets (target seed, drafter seed + 1); recorded
    verify: bool = True  # reload each graph and check parity with eager PyTorch before renaming
    ort_mobile: bool = True  # onnx: also each graph's .ort (ORT mobile format); off: --no-ort
    # expected.json (what validate checks): the eager target on this many of the shipped
    # prompts, spread over the tasks (``catalog.prompts.spread``); None: all of them
    reference_prompts: int | None = None
    specs: dict[str, ModelSpec] = field(init=False, repr=False, compare=False)  # role -> preset

    def __post_init__(self) -> None:
        # the names are resolved here, once per command (KeyError listing valid presets)
        specs = {role: s if isinstance(s, ModelSpec) else get_preset(s)
                 for role, s in (("target", self.target), ("drafter", self.drafter))}  # fmt: skip
        object.__setattr__(self, "specs", specs)
        for role in ROLES:
            get_recipe(self.backend, self.recipe_name(role))  # KeyError listing valid names
        if not 8 <= self.max_seq_len <= 131072:
            raise ValueError(f"max_seq_len {self.max_seq_len} outside [8, 131072]")
        if not 1 <= self.draft_len <= 32 or self.draft_len + 1 > self.max_seq_len:
            raise ValueError(f"draft_len {self.draft_len} outside [1, min(32, max_seq_len - 1)]")
        if self.reference_prompts is not None and self.reference_prompts < 1:
            raise ValueError(f"reference_prompts {self.reference_prompts}: at least 1")
        if not self.ort_mobile and get_backend(self.backend).backend is not Backend.ONNX:
            raise ValueError(f"--no-ort: the {self.backend} backend writes no .ort files")

    def recipe_name(self, role: str) -> str:
        """The quantisation recipe of ``role``'s graph (e.g. a ``w8a8`` target that makes
        verification cheap beside an ``int8`` drafter that keeps its top-1)."""
        if role == "drafter" and self.drafter_quantization is not None:
            return self.drafter_quantization
        return self.quantization


def _default_verify(
    cfg: ExportConfig, prompts: dict[str, Sequence[Sequence[int]]] | None
) -> Verify:
    from omnidraft_deploy.exporters.verify import verify_artifact

    def verify(path: Path, info: GraphInfo, eager: Transformer) -> dict[str, float]:
        role = "target" if path.stem == "target" else "drafter"
        recipe = get_recipe(cfg.backend, cfg.recipe_name(role))
        return verify_artifact(
            path, info, eager, recipe, (prompts or {}).get(role), verify_len=cfg.draft_len + 1
        )

    return verify


def _export_role(
    cfg: ExportConfig, role: str, tmp: Path, *, verify: Verify | None, eos_ids: tuple[int, ...],
    bundle_hash: str, extras: dict[str, Any],
) -> tuple[GraphInfo, Transformer]:  # fmt: skip
    """Load ``role``'s eager model (once), export and verify its graph: (its info, the model)."""
    spec = cfg.specs[role]
    weights = cfg.target_model if role == "target" else cfg.drafter_model
    stages: dict[str, Any] = {}
    with stage(stages, "load"):
        model = load_model(
            spec, seed=cfg.seed + (role == "drafter"), max_seq_len=cfg.max_seq_len, weights=weights
        )
    options = {} if cfg.ort_mobile else {"ort_mobile": False}  # the onnx recipe's (checked)
    with stage(stages, "export"):
        info, facts = get_exporter(cfg.backend)(
            model, spec, tmp, role=role,
            recipe=get_recipe(cfg.backend, cfg.recipe_name(role)), draft_len=cfg.draft_len,
            eos_ids=eos_ids, bundle_hash=bundle_hash, **options,
        )  # fmt: skip
    speed: dict[str, float] = {}
    if verify is not None:
        with stage(stages, "verify"):
            checked = verify(tmp / info.file, info, model)
            if info.decode_file is not None:  # the T = 1 twin: its parity goes to the extras
                facts["decode"]["parity"] = verify(
                    tmp / info.decode_file, info.decode_info(), model
                )
        speed = {k: checked.pop(k) for k in list(checked) if k.startswith("speed_")}
        info = dataclasses.replace(info, parity=checked)
    extras[role] = {"stages": stages, cfg.backend: facts, "bytes": (tmp / info.file).stat().st_size,
                    "speed": speed}  # fmt: skip
    return info, model


def file_roles(tmp: Path, graphs: dict[str, GraphInfo]) -> dict[str, str]:
    roles = {g.file: f"{role}_graph" for role, g in graphs.items()}
    roles |= {g.decode_file: f"{role}_graph" for role, g in graphs.items() if g.decode_file}
    for p in tmp.glob("*.onnx.data"):
        roles[p.name] = "external_weights"
    for p in tmp.glob("*.ort"):
        roles[p.name] = "ort_mobile_graph"
    for p in [*tmp.glob("*_ctx.onnx"), *tmp.glob("*_ctx_*.bin")]:
        roles[p.name] = HTP_CONTEXT  # QNN: the precompiled EPContext model and its binary
    return roles


def export_bundle(
    cfg: ExportConfig,
    *,
    extra_files: dict[str, tuple[bytes, str]] | None = None,
    derived_files: Derived | None = None,
    tokenizer_dirs: dict[str, Path] | None = None,
    mapping_hash: str = "",
    eos_ids: dict[str, tuple[int, ...]] | None = None,
    verify: Verify | None = None,
    prompts: dict[str, Sequence[Sequence[int]]] | None = None,
    opener: Callable[[Path], Any] | None = None,
    drafter_from: Path | None = None,
    target_from: Path | None = None,
) -> Path:
    """Write the bundle folder ``cfg.out_dir`` and return it (see the module docstring).

    extra_files: relative path -> (bytes, manifest role), e.g. ``vocab_map.bin``, ``ngram_cache.bin``.
    derived_files: the same, computed from the written graphs (staging folder, role -> GraphInfo,
    the eager target the export loaded), e.g. ``expected.json`` from what the target graph computes.
    tokenizer_dirs: role ("drafter"/"target") -> folder whose files go to ``<role>_tokenizer/``.
    mapping_hash: the vocabulary map's content hash (manifest; ``.pte`` ``get_bundle_hash``).
    eos_ids: role -> EOS ids (``.pte`` ``get_eos_ids``). verify: replaces the built-in check
    (``exporters.verify.verify_artifact``) when given; no check at all when ``cfg.verify`` is off.
    prompts: role -> verification prompt ids (default: shipped prompts, real tokenizer).
    opener: called with the staged folder once it is complete; raising refuses the bundle (the
    folder at ``cfg.out_dir`` stays as it was).
    drafter_from: a bundle of the same drafter, backend and recipe whose drafter graph files and
    description are linked in instead of exported and verified again (``exporters.multi``).
    target_from: the same for the target (``--target-from``: a new drafter for a target exported
    once); that bundle's ``expected.json`` comes along, since it records what this very target
    graph computes, and ``derived_files`` is not called. The bundle must hold the same weights,
    backend, recipe and context, or ``ValueError`` names what differs.
    """
    if not cfg.verify:
        verify = None
    elif verify is None:
        verify = _default_verify(cfg, prompts)
    from omnidraft_deploy.resolve.weights_spec import weights_record

    extras: dict[str, Any] = {
        "seed": cfg.seed,
        **{f"{role}_model": None if w is None else weights_record(w)
           for role, w in (("target", cfg.target_model), ("drafter", cfg.drafter_model))},
        "max_seq_len": cfg.max_seq_len, "verified": verify is not None,
        "runtime_versions": _runtime_versions(),  # the app needs a runtime >= these
    }  # fmt: skip
    with atomic_bundle_dir(cfg.out_dir) as tmp:
        graphs: dict[str, GraphInfo] = {}
        model: Transformer | None = None
        linked = {"drafter": drafter_from, "target": target_from}
        for role in tqdm(ROLES, desc=f"export {cfg.backend}/{cfg.quantization}", unit="graph"):
            # the target comes last (ROLES) and stays loaded for ``derived_files``; the drafter's
            # model is freed before the target loads
            model = None
            if (source := linked[role]) is not None:
                graphs[role] = _link_graph(source, role, tmp, extras, cfg)
                continue
            graphs[role], model = _export_role(
                cfg, role, tmp, verify=verify,
                eos_ids=(eos_ids or {}).get(role, ()), bundle_hash=mapping_hash, extras=extras,
            )  # fmt: skip
        if target_from is not None:
            old = target_from / EXPECTED_FILE
            derived = {EXPECTED_FILE: (old.read_bytes(), EXPECTED_ROLE)} if old.is_file() else {}
        else:
            assert model is not None
            derived = derived_files(tmp, graphs, model) if derived_files is not None else {}
        model = None
        roles = file_roles(tmp, graphs) | _write_files(
            tmp, (extra_files or {}) | derived, tokenizer_dirs or {}
        )
        files = {rel: file_entry(tmp, rel, role) for rel, role in sorted(roles.items())}
        manifest = Manifest(
            backend=cfg.backend, draft_len=cfg.draft_len, mapping_hash=mapping_hash,
            graphs=graphs, files=files, extras=extras,
        )  # fmt: skip
        write_text_atomic(tmp / "manifest.json", manifest.to_json())
        if opener is not None:
            open_staged(tmp, [*files, "manifest.json"], Path(cfg.out_dir).name, opener)
    log.info("bundle written to %s", cfg.out_dir)
    return Path(cfg.out_dir)


def _link_graph(bundle: Path, role: str, tmp: Path, extras: dict[str, Any],
                cfg: ExportConfig) -> GraphInfo:  # fmt: skip
    """The ``role`` graph files of ``bundle`` (hard links where the file system allows), its
    description and export facts: a graph exported (and verified) once, reused. ``ValueError``
    when ``bundle`` does not hold the graph ``cfg`` asks for (weights, backend, recipe, context)."""
    from omnidraft_deploy.bundle.folder import verify_bundle
    from omnidraft_deploy.resolve.weights_spec import weights_record

    manifest = verify_bundle(bundle)
    info = manifest.graphs[role]
    model = cfg.target_model if role == "target" else cfg.drafter_model
    wanted = {"backend": cfg.backend, "recipe": cfg.recipe_name(role),
              "max_seq_len": cfg.max_seq_len, "preset": cfg.specs[role].name,
              "weights": None if model is None else weights_record(model)}  # fmt: skip
    found = {"backend": manifest.backend, "recipe": info.quantization,
             "max_seq_len": info.max_seq_len, "preset": info.preset,
             "weights": manifest.extras.get(f"{role}_model")}  # fmt: skip
    differ = [f"{k} {found[k]!r} (wanted {wanted[k]!r})" for k in wanted if found[k] != wanted[k]]
    if differ:
        raise ValueError(
            f"{bundle}: its {role} graph is not the one asked for: {'; '.join(differ)}"
        )
    for rel in manifest.files:
        if rel.startswith(role) and "/" not in rel:  # <role>.onnx, .ort, .onnx.data, .pte
            try:
                os.link(bundle / rel, tmp / rel)
            except OSError:
                shutil.copyfile(bundle / rel, tmp / rel)
    extras[role] = manifest.extras.get(role, {})
    extras[f"{role}_from"] = str(bundle)
    return info


def open_staged(tmp: Path, listed: list[str], name: str, opener: Callable[[Path], Any]) -> None:
    """``opener`` on a view of the staged bundle: its listed files hard-linked (copied where the
    file system has no links) into ``<staged>/.opened/<name>``, removed before publishing. The
    runtime refuses to open a folder named as a staging folder, by design; the view also holds
    nothing the manifest does not list."""
    view = tmp / ".opened" / name
    try:
        for rel in listed:
            (view / rel).parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(tmp / rel, view / rel)
            except OSError:
                shutil.copyfile(tmp / rel, view / rel)
        opener(view)
    finally:
        shutil.rmtree(tmp / ".opened", ignore_errors=True)


def _write_files(
    tmp: Path, files: dict[str, tuple[bytes, str]], tokenizer_dirs: dict[str, Path]
) -> dict[str, str]:
    """Write the caller's files and tokenizer folders into ``tmp``: relative path -> role."""
    roles = {}
    for role, folder in tokenizer_dirs.items():
        for src in sorted(Path(folder).iterdir()):
            if src.is_file():
                write_bytes_atomic(tmp / f"{role}_tokenizer" / src.name, src.read_bytes())
                roles[f"{role}_tokenizer/{src.name}"] = f"{role}_tokenizer"
    for rel, (data, role_name) in files.items():
        write_bytes_atomic(tmp / rel, data)
        roles[rel] = role_name
    return roles


def _runtime_versions() -> dict[str, str]:
    """Installed exporter runtimes (``executorch``, ``onnxruntime``): the Android app refuses a
    bundle whose exporter is newer than its runtime (android_demo ``RuntimeVersions``)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("executorch", "onnxruntime"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            continue
    return out
