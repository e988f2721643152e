"""``omnidraft distill BUNDLE``: the target answers requests, the drafter learns its replies.

The verb composes three rooms: the requests (``distill.requests``: ``--prompts`` or the shipped
sets), the teacher and learner (``runtime.distill``) and the publish (``publish_for``, shared with
``omnidraft adapt``: a single-target bundle gets its drafter graph re-exported from the new
weights and verified, ``exporters.publish``, the target's files copied as they are; a target of a
multi-target bundle gets the weights swapped into the shared drafter graph, checked and written to
its state folder, ``runtime.adapted``). The replies live in the target's state folder, so a killed
run loses at most the reply in flight and the next run resumes. ``--minutes`` bounds the whole
run: teaching stops taking requests at ``TEACH_SHARE`` of it, training at the end of it.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from omnidraft_deploy.cli.console import library_stdout

TEACH_SHARE = 0.7  # of --minutes: teaching; the rest trains


def publish_for(root: Path, view: Any, state: Path, drafter: Any) -> Path:
    """Publish ``drafter`` for the selected target of ``view`` (module docstring)."""
    from omnidraft_deploy.exporters.publish import publish_drafter
    from omnidraft_deploy.runtime.adapted import publish_target_weights

    if view.targets:
        return publish_target_weights(root, view, state, drafter)
    return publish_drafter(root, drafter)


def _requests(args: argparse.Namespace) -> list[Any]:
    from omnidraft_deploy.distill.requests import shipped_requests, user_requests

    if args.prompts:
        return user_requests(args.prompts)[: args.replies]
    return shipped_requests(math.ceil(args.replies / 5), seed=args.seed)[: args.replies]


def _bar(desc: str, unit: str) -> Any:
    from tqdm import tqdm

    return lambda r: tqdm(r, desc=desc, unit=unit, file=sys.stderr, mininterval=1)


def _carry(old: Path, new: Path, replies: Path) -> None:
    """A single-target publish gives the bundle a new id, so a new default state folder: the
    replies go with it (copied whole, then renamed into place)."""
    if old.resolve() == new.resolve() or not replies.exists():
        return
    tmp = new / f".{replies.name}.tmp"
    shutil.copyfile(replies, tmp)
    tmp.replace(new / replies.name)


def cmd_distill(args: argparse.Namespace) -> int:
    import torch

    from omnidraft_deploy.cli.main import _state
    from omnidraft_deploy.distill.adapt import AdaptConfig
    from omnidraft_deploy.distill.replies import REPLIES, load_replies
    from omnidraft_deploy.runtime import distill as rd
    from omnidraft_deploy.runtime.bundle import open_bundle
    from omnidraft_deploy.runtime.run import decoding_profile

    t0 = time.monotonic()
    stop = None if args.minutes is None else t0 + 60 * args.minutes
    torch.set_num_threads(args.threads)
    requests = _requests(args)
    state = _state(args.bundle, args.state, args.target)
    path = state / REPLIES
    with library_stdout(getattr(args, "verbose", False)):
        bundle = open_bundle(args.bundle, target=args.target, state=state, threads=args.threads)
    chat = not args.no_chat and bool(getattr(bundle.tokenizer, "chat_template", None))
    todo, had = rd.todo(bundle, requests, path, budget=args.replies,
                        max_new_tokens=args.max_new_tokens, chat=chat)  # fmt: skip
    print(f"distill: {had} replies in {path}, {len(todo)} to ask ({len(requests)} requests, "
          f"{'chat template' if chat else 'plain text'}, teacher: the bundle's target)",
          file=sys.stderr, flush=True)  # fmt: skip
    if todo:
        profile = decoding_profile(bundle, state)
        teach_stop = None if stop is None else t0 + TEACH_SHARE * (stop - t0)
        taught = rd.teach(bundle, todo, path, max_new_tokens=args.max_new_tokens, chat=chat,
                          had=had, deadline=teach_stop, profile=profile,
                          progress=_bar("teach", "reply"))  # fmt: skip
        print(f"distill: taught {taught.taught} replies ({taught.tokens} tokens) in "
              f"{taught.seconds:.0f} s{'; time budget reached' if taught.stopped_early else ''}"
              f"{f'; {taught.skipped} longer than the context skipped' if taught.skipped else ''}",
              file=sys.stderr, flush=True)  # fmt: skip
    if args.teach_only:
        return 0
    teacher = rd.teacher_name(bundle)
    replies = [r for r in load_replies(path) if r.teacher == teacher]
    cfg = AdaptConfig(lr=args.lr, lam=args.lam, seqkd=args.seqkd, batch_size=args.batch_size,
                      steps_per_update=1, seq_len=args.seq_len,
                      train_layers=args.train_layers)  # fmt: skip
    learned = rd.learn(bundle, replies, cfg, epochs=args.epochs, state=state, deadline=stop,
                       progress=_bar("train", "step"))  # fmt: skip
    r = learned.report
    print(f"held-out agreement ({learned.held_replies} replies held out, "
          f"{learned.train_replies} trained on, {r.optimizer_steps} steps in {r.seconds:.0f} s"
          f"{', time budget reached' if r.stopped_early else ''}): "
          f"before {learned.before:.3f} -> after {learned.after:.3f}", flush=True)  # fmt: skip
    if not learned.better or args.dry_run:
        why = "--dry-run" if args.dry_run else "held-out agreement did not rise"
        print(f"not published ({why}); the bundle's drafter is unchanged")
        return 0
    return _publish(args, bundle, state, learned.drafter, path)


def _publish(args: argparse.Namespace, bundle: Any, state: Path, drafter: Any, path: Path) -> int:
    from omnidraft_deploy.bundle.folder import read_manifest
    from omnidraft_deploy.bundle.targets import select
    from omnidraft_deploy.cli.main import _state
    from omnidraft_deploy.runtime.adapted import save_distilled

    root = Path(args.bundle)
    print("distill: publishing the new drafter", file=sys.stderr, flush=True)
    with library_stdout(getattr(args, "verbose", False)):
        written = publish_for(root, bundle.manifest, state, drafter)
    if not bundle.manifest.targets:  # a new bundle id: its state folder may be another
        new_state = _state(args.bundle, args.state, args.target)
        view = select(read_manifest(root), args.target, source=root / "manifest.json")
        save_distilled(view, new_state, drafter)
        _carry(state, new_state, path)
    print(f"published: {written}")
    return 0
