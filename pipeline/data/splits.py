"""Deterministic train/val/test splits, the dataset fingerprint, and what a model needs to know.

`load_splits(recipe)` is what training and export share: the same recipe and seed always give the
same three splits. `DataInfo` is the data-shape record that `build_model` consumes and that the
manifest keeps (under `stages.train.data`) so a model can be rebuilt from the artifact alone.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from pipeline.core.errors import InputError
from pipeline.data.sources import RawData, read_source
from pipeline.data.summary import summarize
from pipeline.data.text import TextBase
from pipeline.recipe.schema import Recipe

TEXT_IDS, TEXT_MASK = "input_ids", "attention_mask"  # a text model's inputs, named as transformers names them


@dataclass(frozen=True)
class DataInfo:
    """The shape of one sample and the facts a model is built from."""

    # features | image | tokens | text (token ids and attention mask from a transformers tokenizer) | lm (a causal
    # LM's rows: the same inputs, and as target the next-token labels [n, T])
    kind: str
    sample_shape: list[int]  # one sample without the batch dim: [64], [1, 8, 8], [32] (longest sequence)
    num_classes: int  # the model's output width: the classes of a classifier, 1 for regression, lm: the vocabulary
    labels: list[str] = field(default_factory=list)
    vocab_size: int | None = None  # tokens: largest id + 1; text: the ids the model embeds
    mean: list[float] | None = None  # train-split mean per feature (features) or per channel (images)
    std: list[float] | None = None  # matching std; 1.0 where a feature is constant
    image: dict[str, Any] | None = None  # images: how a picture becomes a sample (pipeline/runtime/images.py)
    # regression: the train split's target mean and std; the model's last layer maps its output
    # back to target units with them (it trains on standardized targets), so it predicts in those units
    target_mean: float | None = None
    target_std: float | None = None
    # features: each column's name in input order, and a categorical column's categories: the input
    # holds the category's index there and the model one-hot encodes it (zoo.OneHot)
    features: list[dict[str, Any]] | None = None
    # text: the id short rows are padded with, and the longest row the model takes (serving truncates to it)
    padding_id: int | None = None
    max_length: int | None = None

    @property
    def categorical(self) -> dict[int, int]:
        """Column index -> number of categories, for each categorical feature column."""
        return {i: len(f["categories"]) for i, f in enumerate(self.features or []) if f.get("categories")}

    @property
    def input_name(self) -> str:
        """The first (or only) model input: the ids of a text model."""
        return self.input_names[0]

    @property
    def input_names(self) -> list[str]:
        """The model's inputs, in the order its forward takes them."""
        if self.kind in ("text", "lm"):
            return [TEXT_IDS, TEXT_MASK]
        return ["tokens" if self.kind == "tokens" else "input"]

    @property
    def dtype(self) -> str:
        return "int64" if self.kind in ("tokens", "text", "lm") else "float32"

    @property
    def layout(self) -> str:
        return {"features": "NC", "image": "NCHW", "tokens": "NT", "text": "NT", "lm": "NT"}[self.kind]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DataInfo:
        return cls(**data)


@dataclass
class Split:
    """One split: model inputs by name (as the manifest names them) and the targets."""

    inputs: dict[str, np.ndarray]
    target: np.ndarray  # [n] int64 class indices, [n] float32 values (regression), or [n, T] labels (lm)

    def __len__(self) -> int:
        return len(self.target)


@dataclass
class Splits:
    train: Split
    val: Split
    test: Split
    info: DataInfo
    fingerprint: str  # sha256 of the whole dataset's content (features and labels), before splitting
    summary: list[str] = field(default_factory=list)  # what was read, for the user (pipeline/data/summary.py)
    base: TextBase | None = None  # text: the tokenizer the ids were made with, and the model directory's digest


def load_splits(recipe: Recipe) -> Splits:
    """Read the recipe's data and split it with `train.seed`; the same recipe gives the same splits."""
    raw = read_source(recipe)
    train_idx, val_idx, test_idx = split_indices(
        len(raw.y), recipe.data.val_fraction, recipe.data.test_fraction, recipe.train.seed
    )
    mean = std = None
    if recipe.data.normalize and raw.kind not in ("tokens", "text", "lm"):
        mean, std = _stats(raw.x[train_idx], raw.kind)
        for i, feature in enumerate(raw.features or []):
            if feature.get("categories"):  # category indices are one-hot encoded, never standardized
                mean[i], std[i] = 0.0, 1.0
    target_mean = target_std = None
    if recipe.task == "regression":
        target_mean, target_std = _target_stats(raw.y[train_idx])
    info = DataInfo(
        kind=raw.kind,
        sample_shape=[int(d) for d in raw.x.shape[1:]],
        num_classes=1
        if recipe.task == "regression"
        else (raw.text or {}).get("vocab_size", 0)
        if raw.kind == "lm"
        else len(raw.labels),
        labels=raw.labels,
        vocab_size=(raw.text or {}).get("vocab_size") or (int(raw.x.max()) + 1 if raw.kind == "tokens" else None),
        mean=mean,
        std=std,
        image=raw.image,
        target_mean=target_mean,
        target_std=target_std,
        features=raw.features,
        padding_id=(raw.text or {}).get("padding_id"),
        max_length=(raw.text or {}).get("max_length"),
    )

    def take(idx: np.ndarray) -> Split:
        columns = [raw.x] if raw.mask is None else [raw.x, raw.mask]  # text: ids, then the attention mask
        inputs = {name: np.ascontiguousarray(a[idx]) for name, a in zip(info.input_names, columns, strict=True)}
        return Split(inputs, raw.y[idx])

    source = str(recipe.data.path or recipe.data.source)
    summary = summarize(raw, source, recipe.task)
    return Splits(take(train_idx), take(val_idx), take(test_idx), info, fingerprint(raw), summary, raw.base)


def split_indices(n: int, val_fraction: float, test_fraction: float, seed: int) -> tuple[np.ndarray, ...]:
    """Shuffle 0..n-1 with `seed` and cut it into train, val and test index arrays."""
    n_test, n_val = round(n * test_fraction), round(n * val_fraction)
    if n - n_test - n_val < 1 or n_val < 1 or n_test < 1:
        raise InputError(
            f"the dataset has {n} samples: too few for a train/val/test split with val_fraction "
            f"{val_fraction} and test_fraction {test_fraction}; add data (a few dozen samples at least)"
        )
    order = np.random.default_rng(seed).permutation(n)
    return order[n_test + n_val :], order[n_test : n_test + n_val], order[:n_test]


def fingerprint(raw: RawData) -> str:
    """sha256 over the features and labels, their dtypes and shapes, the class names, and the feature
    columns' names and categories: identical data, identical digest."""
    digest = hashlib.sha256()
    for array in (raw.x, raw.y) if raw.mask is None else (raw.x, raw.y, raw.mask):
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    digest.update("\0".join(raw.labels).encode())
    if raw.features is not None:  # the column names a client sends and the categories the indices stand for
        digest.update(json.dumps(raw.features, sort_keys=True).encode())
    return digest.hexdigest()


def _target_stats(y: np.ndarray) -> tuple[float, float]:
    """Mean and std of the train split's regression targets (std 1 when they are constant)."""
    values = y.astype(np.float64)
    std = float(values.std())
    return float(np.float32(values.mean())), float(np.float32(std if std >= 1e-6 else 1.0))


def _stats(x: np.ndarray, kind: str) -> tuple[list[float], list[float]]:
    """Per-feature ([n, F]) or per-channel ([n, C, H, W]) mean and std of the train split."""
    axes = (0,) if kind == "features" else (0, 2, 3)
    mean = x.astype(np.float64).mean(axis=axes)
    std = x.astype(np.float64).std(axis=axes)
    std[std < 1e-6] = 1.0  # constant features (digits' blank border pixels) are left unscaled
    return mean.astype(np.float32).tolist(), std.astype(np.float32).tolist()
