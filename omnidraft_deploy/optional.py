"""Lazy imports of optional backends with an actionable error (which extra to install)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any


def require(module: str, *, extra: str, purpose: str) -> Any:
    """``importlib.import_module(module)``, or ``ImportError`` naming the pip extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"{purpose} needs {module}: pip install 'omnidraft-deploy[{extra}]'"
        ) from e


def executorch_runtime() -> Any:
    """ExecuTorch's ``Runtime`` class, with the quantized_decomposed kernels registered (the int8
    embedding of the ``*-emb8`` recipes) and the ``llama`` LLM kernels (the in-place KV cache):
    they register on import, and without them such a program fails to load its method (error
    0x14) unless something else imported them first."""
    runtime = require("executorch.runtime", extra="executorch", purpose="the xnnpack backend")
    require("executorch.kernels.quantized", extra="executorch", purpose="quantized .pte kernels")
    llm_kernels()
    return runtime.Runtime


def llm_kernels() -> None:
    """Register ExecuTorch's ``llama::update_cache`` / ``llama::custom_sdpa`` (eager, export and
    the runtime): the in-place KV cache of ``exporters.xnnpack.llm_attention``."""
    require("executorch.extension.llm.custom_ops.custom_ops", extra="executorch",
            purpose="the LLM attention kernels of .pte programs")  # fmt: skip


def pte_program(path: str | Path) -> Any:
    """``path`` loaded as an ExecuTorch program (``executorch_runtime``); ``RuntimeError`` from
    ExecuTorch when it refuses the file."""
    return executorch_runtime().get().load_program(str(path))
