"""Core tests run tiny models: one intra-op thread avoids OpenMP barrier costs that dominate them."""

from __future__ import annotations

import torch

torch.set_num_threads(1)
