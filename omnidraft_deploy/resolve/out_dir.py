"""``omnidraft-export --out DIR``: never delete what is not the bundle's.

An export publishes its bundle by swapping a whole staged folder into ``DIR``
(``bundle.folder.atomic_bundle_dir``), so whatever ``DIR`` holds is gone afterwards. So
``check_out_dir`` accepts only a new or empty folder, or, with ``--force``, a folder holding one
of our bundles and nothing else: every file in it must be ``manifest.json`` or a file the manifest
lists *with the size and sha256 it lists* (a name alone proves nothing: a manifest copied into a
folder of the user's own files lists ``expected.json`` too). Anything else (a user's notes, a file
copied into a bundle or over one of its files, links, a folder with a copied ``manifest.json``) is
refused, naming those files, and nothing in ``DIR`` is touched.
"""

from __future__ import annotations

from pathlib import Path

from omnidraft_deploy.bundle.replace import foreign_entries, our_manifest, proven_files


class InputError(ValueError):
    """A flag's value cannot be used; ``str()`` is one paragraph naming the flag."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}")
        self.flag = flag


def _shown(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f", ... ({len(names)} in all)" if len(names) > 5 else "")


def check_out_dir(out: Path, *, force: bool) -> bool:
    """Refuse a non-empty ``out`` that is not only our bundle, or a bundle without ``force``
    (module docstring). Returns True when ``out`` holds a bundle that the export will replace.
    Never modifies ``out``."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise InputError("--out", f"{out} exists and is not a folder; choose a new folder.")
    if not out.exists() or not any(out.iterdir()):
        return False
    manifest = our_manifest(out)
    if manifest is None:
        names = sorted(p.name for p in out.iterdir())
        raise InputError(
            "--out",
            f"{out} is not empty ({len(names)} entries: {_shown(names)}) and is not an omnidraft "
            "bundle; nothing in it was touched. Choose a new or empty folder for --out.",
        )
    foreign = foreign_entries(out, proven_files(out, manifest.get("files")))
    if foreign:
        raise InputError(
            "--out",
            f"{out} holds a bundle and also {len(foreign)} entries its manifest does not list "
            f"with their size and sha256 ({_shown(foreign)}); an export replaces the whole "
            "folder, so nothing in it was touched. Move those files out, or choose another --out.",
        )
    if not force:
        raise InputError(
            "--out",
            f"{out} already holds a {manifest.get('backend')} bundle; pass --force to replace it "
            "(the old one stays in place until the new one is complete), or choose another --out.",
        )
    return True
