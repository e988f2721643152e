"""omnidraft-deploy: one small drafter that speeds up any target LLM, whatever its tokenizer."""

from __future__ import annotations

__version__ = "0.1.0"
