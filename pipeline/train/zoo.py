"""The model zoo: MLP, CNN, transformer encoder, mixture-of-experts transformer, and your own module.

`build_model(spec, info)` returns a `torch.nn.Module` whose `forward` takes the model inputs
positionally, in manifest order (one tensor: `input` float32 `[batch, F]` / `[batch, C, H, W]`, or
`tokens` int64 `[batch, sequence]`), and returns logits `[batch, classes]` (regression: predictions
`[batch, 1]` in the target's units, through `TargetScale`).

Normalization is baked in: when the data is normalized, the model's first layer subtracts the
train-split mean and divides by the std (buffers saved with the weights), so the exported ONNX
takes raw features and no later hop has to remember to preprocess. Forward passes avoid Python
control flow on tensor values so the dynamo ONNX exporter can trace them.
"""

from __future__ import annotations

import importlib
import inspect
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from pipeline.artifact.tensors import TensorSpec
from pipeline.core.errors import InputError
from pipeline.data import DataInfo
from pipeline.recipe.architectures import CNNSpec, CustomSpec, HFSpec, LoraSpec, MLPSpec, MoESpec, TransformerSpec

NEG_INF = -1e4  # additive attention mask for padding: large enough, and finite in fp16 and bf16


class Standardize(nn.Module):
    """(x - mean) / std with the train split's statistics, per feature ([F]) or per channel ([C, 1, 1])."""

    def __init__(self, mean: list[float], std: list[float], image: bool) -> None:
        super().__init__()
        shape = (-1, 1, 1) if image else (-1,)
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).reshape(shape))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).reshape(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


class TargetScale(nn.Module):
    """Regression: the network's output * std + mean, with the train split's target statistics.

    The network learns standardized targets (a loss of order 1 whatever the units); this last layer,
    buffers saved with the weights, maps its output back, so the model predicts in target units.
    """

    def __init__(self, net: nn.Module, mean: float, std: float) -> None:
        super().__init__()
        self.net = net
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) * self.std + self.mean


class Preprocessed(nn.Module):
    """A network behind the normalization it was trained with, so callers pass raw inputs."""

    def __init__(self, norm: Standardize, net: nn.Module) -> None:
        super().__init__()
        self.norm = norm
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(self.norm(x))


class OneHot(nn.Module):
    """Categorical feature columns, sent as category indices, -> one-hot blocks; other columns pass.

    [batch, F] -> [batch, numeric columns + categories of every categorical column]. An index outside
    0..k-1 (or not whole) matches no category and becomes all zeros; `pipe serve` refuses such values.
    """

    def __init__(self, width: int, categorical: dict[int, int]) -> None:
        super().__init__()
        numeric = [i for i in range(width) if i not in categorical]
        self.register_buffer("numeric", torch.tensor(numeric, dtype=torch.int64), persistent=False)
        self.columns = sorted(categorical)
        for i in self.columns:  # [1, k]: the indices a column's value is compared with
            codes = torch.arange(categorical[i], dtype=torch.float32).reshape(1, -1)
            self.register_buffer(f"codes_{i}", codes, persistent=False)

    @staticmethod
    def width(width: int, categorical: dict[int, int]) -> int:
        return width - len(categorical) + sum(categorical.values())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = [x.index_select(1, self.numeric)]  # [B, numeric]
        for i in self.columns:
            parts.append((x[:, i : i + 1] == getattr(self, f"codes_{i}")).to(x.dtype))  # [B, k]
        return torch.cat(parts, dim=1)


class MLP(nn.Module):
    """Linear-ReLU-Dropout layers over flat features (images are flattened first)."""

    def __init__(self, in_features: int, hidden: list[int], classes: int, dropout: float) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU(), nn.Dropout(dropout)]
            width = h
        layers.append(nn.Linear(width, classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class CNN(nn.Module):
    """Stages of 3x3 conv + ReLU + 2x2 max-pool, then a small MLP head. [B, C, H, W] -> [B, classes]."""

    def __init__(self, in_shape: list[int], channels: list[int], hidden: int, classes: int, dropout: float) -> None:
        super().__init__()
        c, h, w = in_shape
        layers: list[nn.Module] = []
        for out in channels:
            layers += [nn.Conv2d(c, out, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            c, h, w = out, h // 2, w // 2
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(
            nn.Flatten(), nn.Dropout(dropout), nn.Linear(c * h * w, hidden), nn.ReLU(), nn.Linear(hidden, classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class SelfAttention(nn.Module):
    """Multi-head attention written out (matmul + softmax), which every exporter understands."""

    def __init__(self, d_model: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, pad_bias: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)  # 3x[B,H,T,Dh]
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads) + pad_bias  # [B, H, T, T]
        attn = self.drop(scores.softmax(dim=-1))
        return self.out((attn @ v).transpose(1, 2).reshape(b, t, d))


class FeedForward(nn.Module):
    def __init__(self, d_model: int, width: int, dropout: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_model, width), nn.GELU(), nn.Linear(width, d_model), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class MixtureOfExperts(nn.Module):
    """Top-k gated experts, computed densely: every expert runs, a top-k mask picks whose output counts.

    Dense routing costs `experts / top_k` times the FLOPs of sparse dispatch, which is nothing at
    this size, and it has no data-dependent control flow, so it exports to ONNX (TopK, Where,
    Softmax) and converts to TFLite like any other block.
    """

    def __init__(self, d_model: int, width: int, experts: int, top_k: int, dropout: float) -> None:
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(d_model, experts, bias=False)
        self.experts = nn.ModuleList(FeedForward(d_model, width, dropout) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.gate(x)  # [B, T, E]
        kth = logits.topk(self.top_k, dim=-1).values[..., -1:]  # [B, T, 1]: the k-th largest gate logit
        weights = logits.masked_fill(logits < kth, NEG_INF).softmax(dim=-1)  # [B, T, E], zero off the top k
        outs = torch.stack([expert(x) for expert in self.experts], dim=-2)  # [B, T, E, D]
        return (weights.unsqueeze(-1) * outs).sum(dim=-2)  # [B, T, D]


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + ffn(ln(x)); the ffn may be an MoE."""

    def __init__(self, d_model: int, heads: int, ffn: nn.Module, dropout: float) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, heads, dropout)
        self.ffn = ffn

    def forward(self, x: torch.Tensor, pad_bias: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), pad_bias)
        return x + self.ffn(self.ln2(x))


class TokenClassifier(nn.Module):
    """Token + position embeddings, transformer blocks, mean over non-padding tokens, linear head.

    Takes int64 tokens [B, T] with 0 as padding, for any T <= max_len.
    """

    def __init__(self, spec: TransformerSpec, vocab_size: int, classes: int) -> None:
        super().__init__()
        d, width = spec.d_model, spec.ff_mult * spec.d_model
        self.tok = nn.Embedding(vocab_size, d)
        self.pos = nn.Embedding(spec.max_len, d)
        self.drop = nn.Dropout(spec.dropout)
        moe = isinstance(spec, MoESpec)
        self.blocks = nn.ModuleList(
            Block(
                d,
                spec.heads,
                MixtureOfExperts(d, width, spec.experts, spec.top_k, spec.dropout)
                if moe
                else FeedForward(d, width, spec.dropout),
                spec.dropout,
            )
            for _ in range(spec.layers)
        )
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)
        self.grad_checkpointing = False  # set by the trainer: recompute each block in backward

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        keep = (tokens != 0).unsqueeze(-1).to(self.tok.weight.dtype)  # [B, T, 1]: 1 for real tokens
        pad_bias = (1.0 - keep.transpose(1, 2)).unsqueeze(1) * NEG_INF  # [B, 1, 1, T]: mask padded keys
        positions = torch.arange(tokens.shape[1], device=tokens.device)  # [T]
        x = self.drop(self.tok(tokens) + self.pos(positions))  # [B, T, D]
        for block in self.blocks:
            if self.grad_checkpointing and self.training:
                x = checkpoint(block, x, pad_bias, use_reentrant=False)
            else:
                x = block(x, pad_bias)
        x = self.ln(x)
        pooled = (x * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1.0)  # [B, D]: mean of real tokens
        return self.head(pooled)


def build_model(spec: Any, info: DataInfo, *, lora: LoraSpec | None = None, base_dir: Path = Path(".")) -> nn.Module:
    """Build the recipe's model for data of shape `info`, normalization included when it has stats.

    `lora` and `base_dir` (the recipe's folder, which `model.path` is relative to) are for `arch: hf`.
    """
    if isinstance(spec, HFSpec) and info.kind == "lm":
        from pipeline.train.causal_lm import build_causal_lm

        return build_causal_lm(base_dir / spec.path, lora)
    if isinstance(spec, HFSpec):
        from pipeline.train.hf import build_text_classifier

        if info.kind != "text":
            raise _mismatch("hf", info, "a transformers model takes text (data.source: text)")
        return build_text_classifier(base_dir / spec.path, info, lora)
    if isinstance(spec, CustomSpec):
        net = _custom(spec, info)
    elif isinstance(spec, MLPSpec):
        if info.kind == "tokens":
            raise _mismatch("mlp", info, "use arch: transformer or moe for token sequences")
        width = math.prod(info.sample_shape)
        if categorical := info.categorical:  # string columns: one-hot inside the model, before the MLP
            onehot = OneHot(width, categorical)
            net = nn.Sequential(
                onehot, MLP(OneHot.width(width, categorical), spec.hidden, info.num_classes, spec.dropout)
            )
        else:
            net = MLP(width, spec.hidden, info.num_classes, spec.dropout)
    elif isinstance(spec, CNNSpec):
        if info.kind != "image":
            raise _mismatch("cnn", info, "a CNN needs images [C, H, W] (digits: set data.as_image: true)")
        _, h, w = info.sample_shape
        if min(h, w) >> len(spec.channels) < 1:
            raise _mismatch(
                "cnn",
                info,
                f"{len(spec.channels)} pooling stages need images of at least "
                f"{2 ** len(spec.channels)} pixels a side; use fewer model.channels or larger data.image_size",
            )
        net = CNN(info.sample_shape, spec.channels, spec.hidden, info.num_classes, spec.dropout)
    elif isinstance(spec, TransformerSpec):  # MoESpec included
        net = _token_model(spec, info)
    else:
        raise InputError(
            f"unknown model spec {type(spec).__name__}; valid arch: mlp, cnn, transformer, moe, custom, hf"
        )
    if info.target_mean is not None and info.target_std is not None:
        net = TargetScale(net, info.target_mean, info.target_std)  # regression: predicts in target units
    if info.mean is not None and info.std is not None:
        return Preprocessed(Standardize(info.mean, info.std, info.kind == "image"), net)
    return net


def inference_model(model: nn.Module) -> nn.Module:
    """The model as it is exported and served: LoRA adapters merged into the base weights; others unchanged."""
    from pipeline.train.hf import TextClassifier  # imports peft only when a text model merges

    return model.merged() if isinstance(model, TextClassifier) else model


def _token_model(spec: TransformerSpec, info: DataInfo) -> nn.Module:
    if info.kind != "tokens":
        raise _mismatch(spec.arch, info, "a transformer takes token sequences (data.source: tokens)")
    length = info.sample_shape[0]
    if length > spec.max_len:
        raise _mismatch(
            spec.arch,
            info,
            f"sequences are {length} tokens but model.max_len is {spec.max_len}; set model.max_len >= {length}",
        )
    vocab = spec.vocab_size or info.vocab_size or 0
    if info.vocab_size and vocab < info.vocab_size:
        raise _mismatch(
            spec.arch,
            info,
            f"token ids reach {info.vocab_size - 1} but model.vocab_size is "
            f"{vocab}; set model.vocab_size >= {info.vocab_size} or remove it",
        )
    return TokenClassifier(spec, vocab, info.num_classes)


def _mismatch(arch: str, info: DataInfo, fix: str) -> InputError:
    return InputError(
        f"model arch {arch!r} does not fit the data: samples are {info.kind} shaped {info.sample_shape}; {fix}"
    )


def _custom(spec: CustomSpec, info: DataInfo) -> nn.Module:
    """Import `package.module:factory` and call it; it returns a module, or (module, input TensorSpec).

    The factory gets `spec.kwargs`, plus `data=info` when it declares a `data` parameter (so it can
    size its input and output layers from the data).
    """
    module_name, func_name = spec.factory.split(":")
    try:
        factory = getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as exc:
        raise InputError(
            f"model.factory {spec.factory!r} cannot be loaded ({exc}); make {module_name} importable "
            "(installed, or on PYTHONPATH) and define the function in it"
        ) from None
    if not callable(factory):
        raise InputError(f"model.factory {spec.factory!r} is a {type(factory).__name__}, not a function")
    kwargs = dict(spec.kwargs)
    try:
        signature = inspect.signature(factory)
    except ValueError:  # some builtins have none: the call itself will complain
        signature = None
    if signature is not None:
        if "data" in signature.parameters:
            kwargs["data"] = info
        try:
            signature.bind(**kwargs)
        except TypeError as exc:  # a key the function does not take, or a required argument missing
            raise InputError(
                f"model.factory {spec.factory!r} cannot be called with model.kwargs {spec.kwargs} ({exc}); "
                "pass the arguments it takes"
            ) from None
    result = factory(**kwargs)
    declared = None
    if isinstance(result, tuple) and len(result) == 2:
        result, declared = result
    if not isinstance(result, nn.Module):
        raise InputError(f"model.factory {spec.factory!r} returned {type(result).__name__}, not a torch.nn.Module")
    if declared is not None:
        _check_declared(spec.factory, declared, info)
    return result


def _check_declared(factory: str, declared: Any, info: DataInfo) -> None:
    """A factory's declared input must agree with the data (dtype, and every non-symbolic dim)."""
    try:
        spec = declared if isinstance(declared, TensorSpec) else TensorSpec(**declared)
    except TypeError as exc:
        raise InputError(
            f"model.factory {factory!r} declares its input as {declared!r}, not a TensorSpec ({exc})"
        ) from None
    dims = list(spec.shape[1:])
    if (
        spec.dtype != info.dtype
        or len(dims) != len(info.sample_shape)
        or any(isinstance(d, int) and d != s for d, s in zip(dims, info.sample_shape, strict=True))
    ):
        raise InputError(
            f"model.factory {factory!r} declares input {spec.dtype} {spec.shape}, but the data gives "
            f"{info.dtype} {['batch', *info.sample_shape]}; change the model or the data"
        )
