"""Lazy imports of optional backends with an actionable error (which extra to install)."""

from __future__ import annotations

import importlib
from typing import Any


def require(module: str, *, extra: str, purpose: str) -> Any:
    """``importlib.import_module(module)``, or ``ImportError`` naming the pip extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"{purpose} needs {module}: pip install 'omnidraft-deploy[{extra}]'"
        ) from e
