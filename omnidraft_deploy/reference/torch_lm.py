"""``EagerLM``: a ``reference.model.Transformer`` behind the ``CausalLM`` protocol."""

from __future__ import annotations

import torch
from torch import Tensor

from omnidraft_deploy.reference.model import Transformer


class EagerLM:
    """Eager PyTorch reference runtime; counts forward calls for the statistics."""

    def __init__(self, model: Transformer) -> None:
        self.model = model.eval()
        self.n_calls = 0

    @property
    def vocab_size(self) -> int:
        return self.model.args.vocab_size

    @property
    def max_seq_len(self) -> int:
        return self.model.args.max_seq_len

    @torch.inference_mode()
    def forward(self, token_ids: Tensor, start_pos: int) -> Tensor:
        t = token_ids.shape[0]
        if start_pos + t > self.max_seq_len:
            raise ValueError(
                f"sequence of {start_pos + t} tokens exceeds max_seq_len {self.max_seq_len}"
            )
        self.n_calls += 1
        input_pos = torch.arange(start_pos, start_pos + t, dtype=torch.long)
        return self.model(token_ids.view(1, t), input_pos)[0].float()
