"""Publish an adapted drafter into its bundle: the last step of ``omnidraft adapt``.

``publish_drafter(bundle_dir, drafter)`` re-exports the drafter graph from the adapted eager
weights with the bundle's own backend and recipe (``EXPORTERS``), verifies it against those
weights (``exporters.verify``, the same check as export), copies every other listed file
unchanged, writes a new manifest (``extras.drafter.adapted`` counts the publishes) and swaps the
whole folder into place (``manifest.atomic_bundle_dir``): a kill at any point leaves the last good
bundle at ``bundle_dir``. Re-exporting rather than patching weights in place keeps one path for
every backend (``.pte``, quantised and static-T graphs included); for the small drafters it takes
seconds.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from pathlib import Path

from omnidraft_deploy.exporters import get_exporter
from omnidraft_deploy.exporters.bundle import file_roles
from omnidraft_deploy.exporters.verify import verify_artifact

from omnidraft_deploy.bundle.atomic import write_text_atomic
from omnidraft_deploy.bundle.files import file_entry
from omnidraft_deploy.bundle.folder import atomic_bundle_dir, verify_bundle
from omnidraft_deploy.bundle.manifest import Manifest
from omnidraft_deploy.catalog.backends import get_recipe
from omnidraft_deploy.catalog.presets import get_preset
from omnidraft_deploy.reference.model import Transformer
from omnidraft_deploy.vocab import io as vocab_io

log = logging.getLogger(__name__)


def publish_drafter(bundle_dir: str | Path, drafter: Transformer) -> Path:
    """Replace the bundle's drafter graph with ``drafter``'s weights (see the module docstring).

    ``drafter`` must have the architecture and ``max_seq_len`` of the bundle's drafter graph.
    """
    root = Path(bundle_dir)
    old = verify_bundle(root)
    info = old.graphs["drafter"]
    if drafter.args.max_seq_len != info.max_seq_len:
        raise ValueError(f"drafter max_seq_len {drafter.args.max_seq_len} != {info.max_seq_len}")
    recipe = get_recipe(old.backend, info.quantization)
    mapper = vocab_io.load(root / "vocab_map.bin")
    prefix = Path(info.file).stem + "."  # drafter.onnx, drafter.ort, drafter.onnx.data, ...
    keep = {rel: e.role for rel, e in old.files.items() if not rel.startswith(prefix)}
    with atomic_bundle_dir(root) as tmp:
        for rel in keep:  # verified above; the staging folder is renamed into place last
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / rel, tmp / rel)
        new, facts = get_exporter(old.backend)(
            drafter.eval(), get_preset(info.preset), tmp, role="drafter", recipe=recipe,
            draft_len=old.draft_len, eos_ids=mapper.draft_eos, bundle_hash=old.mapping_hash,
        )  # fmt: skip
        parity = verify_artifact(tmp / new.file, new, drafter, recipe)
        graphs = {**old.graphs, "drafter": dataclasses.replace(new, parity=parity)}
        roles = keep | {
            r: role for r, role in file_roles(tmp, graphs).items() if r.startswith(prefix)
        }
        before = old.extras.get("drafter")
        before = before if isinstance(before, dict) else {}
        count = before.get("adapted", 0) if type(before.get("adapted")) is int else 0
        extras = {**old.extras, "drafter": {**before, old.backend: facts, "adapted": count + 1}}
        manifest = Manifest(
            backend=old.backend, draft_len=old.draft_len, mapping_hash=old.mapping_hash,
            graphs=graphs, files={r: file_entry(tmp, r, role) for r, role in sorted(roles.items())},
            extras=extras,
        )  # fmt: skip
        write_text_atomic(tmp / "manifest.json", manifest.to_json())
    log.info("published the adapted drafter into %s", root)
    return root
