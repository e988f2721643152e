"""How many KV-cache slots (``--max-seq-len``) an export gives both graphs.

Default: the models' own context (the smaller of target and drafter: ``RoleInputs.context``, from
the weights' metadata, else the preset), capped by a memory budget: at most ``MAX_DEFAULT_SLOTS``
and at most the largest power of two whose fp32 K + V caches of both graphs fit
``KV_BUDGET_BYTES``. Qwen2.5-Coder-1.5B (context 32,768) + SmolLM2-135M (8,192): 56 KiB + 45 KiB
per slot, 4,096 slots, 404 MiB. The export prints the figures (``choose_max_seq_len``'s note).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omnidraft_deploy.catalog.presets import ModelSpec
    from omnidraft_deploy.resolve.export_inputs import ExportInputs

MAX_DEFAULT_SLOTS = 4096  # a default beyond it is asked for explicitly (--max-seq-len)
KV_BUDGET_BYTES = 1 << 30  # fp32 K + V of both graphs at the default
MIN_SLOTS = 8  # ExportConfig's lower bound


def kv_bytes_per_slot(spec: ModelSpec) -> int:
    """fp32 K + V bytes one position takes in ``spec``'s cache (every layer)."""
    return 2 * 4 * spec.n_layers * spec.n_kv_heads * spec.head_dim


def _floor_pow2(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def _mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def choose_max_seq_len(inputs: ExportInputs, requested: int | None) -> tuple[int, str]:
    """(KV slots of both graphs, one line saying why and what it costs); ``requested``: the
    user's ``--max-seq-len``, kept as given."""
    t, d = inputs.target, inputs.drafter
    per_slot = kv_bytes_per_slot(t.spec) + kv_bytes_per_slot(d.spec)
    context = min(t.context or t.spec.max_seq_len, d.context or d.spec.max_seq_len)
    budget = _floor_pow2(KV_BUDGET_BYTES // per_slot)
    if requested is not None:
        slots, why = requested, "as asked (--max-seq-len)"
        if requested > context:
            why += f", beyond the models' context of {context}: expect worse text past it"
    else:
        slots = max(MIN_SLOTS, min(context, MAX_DEFAULT_SLOTS, budget))
        why = f"the models' context {context}" + (
            "" if slots == context
            else f", capped at {slots} (at most {MAX_DEFAULT_SLOTS} slots and "
            f"{_mib(KV_BUDGET_BYTES)} of KV cache by default; --max-seq-len for more)"
        )  # fmt: skip
    cost = f"KV cache {_mib(per_slot)} per slot x {slots} slots = {_mib(per_slot * slots)}"
    return slots, f"max_seq_len {slots}: {why}; {cost} (fp32, both graphs)"
