"""The tokenizers the project knows, by name, with the id count of each (data only).

The builders are ``vocab.tokenizers.TOKENIZERS`` (same keys; ``tests/core/test_tokenizers.py``
checks both tables). The count lets weights be matched to a registered tokenizer without building
every one (``vocab.from_weights.registered_tokenizer``), and a manifest's tokenizer name be
checked without importing the vocabulary room (``bundle.sections.check_model``).
"""

from __future__ import annotations

IDS: dict[str, int] = {"llama2": 32000, "vicuna": 32000, "llama3": 128256, "qwen2": 151665,
                       "mistral": 32000, "gpt2": 50257, "smollm2": 49152}  # fmt: skip
