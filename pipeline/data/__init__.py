"""Datasets for training: bundled sklearn sets, CSV, NPZ, image folders, token sequences.

`load_splits(recipe)` is the entry point other stages use (export evaluates on its test split).
"""

from pipeline.data.splits import DataInfo, Split, Splits, load_splits

__all__ = ["DataInfo", "Split", "Splits", "load_splits"]
