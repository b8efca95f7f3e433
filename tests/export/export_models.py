"""Tiny torch modules for the export tests: one of each zoo family, plus deliberately awkward ones."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, CLASSES, SEQ = 20, 3, 8


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [batch, 6] -> [batch, classes]
        return self.net(x)


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Linear(4 * 4 * 4, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [batch, 1, 8, 8] -> [batch, classes]
        return self.head(self.conv(x).flatten(1))


class Transformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.position = nn.Parameter(torch.randn(32, 16) * 0.02)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(16, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # [batch, sequence] int64 -> [batch, classes]
        h = self.embed(tokens) + self.position[: tokens.shape[1]]
        return self.head(self.encoder(h).mean(dim=1))


class MoE(nn.Module):
    """Top-2-of-4 routing: every expert runs, each token keeps the gate weights of its top 2."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.gate = nn.Linear(16, 4)
        self.experts = nn.ModuleList([nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)) for _ in range(4)])
        self.head = nn.Linear(16, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)  # [batch, sequence, 16]
        weights, chosen = torch.topk(self.gate(h).softmax(-1), 2, dim=-1)  # [batch, sequence, 2]
        mixed = torch.zeros_like(h)
        for index, expert in enumerate(self.experts):
            share = ((chosen == index).to(h.dtype) * weights).sum(-1, keepdim=True)  # [batch, sequence, 1]
            mixed = mixed + share * expert(h)
        return self.head(mixed.mean(dim=1))


class BranchesOnBatch(nn.Module):
    """Broken on purpose: forward looks at the batch size, so a traced export bakes in one branch."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(6, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 2:
            return self.net(x) * 1.5
        return self.net(x)


class GridSampler(nn.Module):
    """Uses GridSample, which ONNX defines only from opset 16."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [batch, 1, 8, 8] -> [batch, 16]
        grid = torch.zeros(x.shape[0], 4, 4, 2)
        return F.grid_sample(x, grid, align_corners=False).flatten(1)


def branching_digits(data: object) -> nn.Module:
    """`arch: custom` factory for the digits features: a trained model whose forward branches on batch size."""
    model = BranchesOnBatch()
    model.net = nn.Linear(64, 10)
    return model
