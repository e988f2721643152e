"""``omnidraft profile BUNDLE``: open a bundle's ONNX graphs as decoding opens them and save their
measured cost profile (``omnidraft_deploy.host.profile``) to the bundle's session folder."""

from __future__ import annotations

from pathlib import Path

from omnidraft_deploy.runtime.bundle import check_graph
from omnidraft_deploy.runtime.onnxruntime_model import OrtModel

from omnidraft_deploy.bundle.folder import verify_bundle
from omnidraft_deploy.bundle.manifest import Manifest
from omnidraft_deploy.host.profile import Progress, measure, save_profile
from omnidraft_deploy.protocols import CausalLM


def bundle_graph(
    bundle: Path, manifest: Manifest, role: str, *, threads: int | None = None
) -> CausalLM:
    """One graph of an onnx bundle (its ``manifest`` verified by the caller), opened as
    ``omnidraft run`` opens it (``OrtModel``: ONNX Runtime's thread-pool defaults; its weights on
    huge pages before it returns, so what is measured is the settled session); ``threads``:
    intra-op threads (None: one per physical core)."""
    check_graph(bundle, manifest, role)
    info = manifest.graphs[role]
    if not info.file.endswith(".onnx"):
        raise ValueError(f"{bundle / info.file}: profile runs ONNX graphs (onnx backend) only")
    path = bundle / info.file
    return OrtModel(path, info, threads=threads)


def profile_bundle(bundle: Path, state: Path, *, k_max: int = 8, reps: int = 7,
                   threads: int | None = None, progress: Progress = lambda r: r) -> Path:  # fmt: skip
    """Measure a bundle's target + drafter graphs and save the profile to ``state``; the bundle
    is verified once (every file hashed, the record in ``state`` refreshed)."""
    manifest = verify_bundle(bundle, state=state, trust_record=False)
    target = bundle_graph(bundle, manifest, "target", threads=threads)
    drafter = bundle_graph(bundle, manifest, "drafter", threads=threads)
    prof = measure(target, {"drafter": drafter}, k_max=k_max, reps=reps, progress=progress)
    return save_profile(prof["drafter"], state)
