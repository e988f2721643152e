"""The exporter registry: ``EXPORTERS`` name -> exporter, filled by ``@register`` in each recipe
package (``exporters/__init__.py`` imports them); ``get_exporter`` fails loudly. The exporter
signature is in the package docstring."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omnidraft_deploy.bundle.sections import GraphInfo

Exporter = Callable[..., tuple[GraphInfo, dict[str, Any]]]
EXPORTERS: dict[str, Exporter] = {}


def register(name: str) -> Callable[[Exporter], Exporter]:
    """Decorator: ``@register("xnnpack")`` adds the function to ``EXPORTERS`` (no silent override)."""

    def deco(fn: Exporter) -> Exporter:
        if name in EXPORTERS and EXPORTERS[name] is not fn:
            raise ValueError(f"exporter {name!r} registered twice")
        EXPORTERS[name] = fn
        return fn

    return deco


def get_exporter(name: str) -> Exporter:
    """The exporter registered as ``name``; KeyError listing the valid names otherwise."""
    try:
        return EXPORTERS[name]
    except KeyError:
        raise KeyError(f"unknown exporter {name!r}; choose from {sorted(EXPORTERS)}") from None
