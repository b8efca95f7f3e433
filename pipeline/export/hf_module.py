"""A transformers model with a task's head, as the module `pipe import DIR` exports and gates against.

Imported inside the import only (it imports torch at the top): the CLI's --help and the server never load it.
"""

from __future__ import annotations

import torch


class TaskHead(torch.nn.Module):
    """The model's inputs positionally (`names` order); out: the logits (classification), or the last hidden
    state pooled (`mean` over the attention mask, or the first token: `cls`), L2-normalized if asked."""

    def __init__(self, model: torch.nn.Module, names: list[str], task: str, pooling: str, normalize: bool) -> None:
        super().__init__()
        self.model, self.names = model, names
        self.task, self.pooling, self.normalize = task, pooling, normalize

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        given = dict(zip(self.names, tensors, strict=True))
        out = self.model(**given)
        if self.task == "classification":
            return out.logits  # [B, classes]
        hidden = out.last_hidden_state  # [B, T, H]
        if self.pooling == "cls":
            pooled = hidden[:, 0]  # [B, H]: the first ([CLS]) token
        elif "attention_mask" in given:
            keep = given["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # [B, T, 1]: 1 for real tokens
            pooled = (hidden * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1e-9)  # [B, H]: mean of real tokens
        else:
            pooled = hidden.mean(dim=1)
        if self.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled
