"""What the candidates of one `--quantize auto` search share: the pre-processed graph and the calibrated ranges.

Every candidate is made from the same model.onnx, so onnxruntime's pre-processing (symbolic shape
inference and graph optimization: about 8 s for a MobileNet at 224x224 on a busy 2-core machine)
gives the same graph each time, and calibration (every activation of every calibration sample)
gives the same ranges for every candidate that differs only in weight settings (per-channel,
reduce-range), the activation type or the nodes left in fp32. `QuantCache` keeps both, keyed by
the sha256 of the graph they were made from, so a different graph is pre-processed and
calibrated anew: a cache that outlives its graph gives nothing, never wrong ranges.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.runtime.external_data import copy_model


@dataclass
class Preprocessed:
    """One pre-processing outcome: the graph it wrote (None: it failed) and the warnings it gave."""

    path: Path | None
    warnings: list[str]


@dataclass
class QuantCache:
    """Pre-processed graphs and calibrated ranges kept under `directory` for one search.

    `computed` lists each calibration that ran (method names, in order) and `preprocessings` counts
    the pre-processing runs: once per method and graph, and once per graph, however many candidates.
    """

    directory: Path
    computed: list[str] = field(default_factory=list)
    preprocessings: int = 0
    _preprocessed: dict[str, Preprocessed] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)

    def ranges(self, method: str, graph: Path) -> Path:
        """The file onnxruntime keeps `method`'s ranges for `graph` in (absent until it calibrated)."""
        return self.directory / f"ranges-{method}-{_digest(graph)}.json"

    def preprocessed(self, named: Path, out: Path) -> Preprocessed | None:
        """The earlier pre-processing of a graph equal to `named`, copied to `out`; None when there was none."""
        kept = self._preprocessed.get(_digest(named))
        if kept is None:
            return None
        if kept.path is not None:
            copy_model(kept.path, out)
        return Preprocessed(out if kept.path is not None else None, list(kept.warnings))

    def keep_preprocessed(self, named: Path, result: Path | None, warnings: list[str]) -> None:
        """Remember how `named` pre-processed: a copy of `result` (None: it failed) and its warnings."""
        digest = _digest(named)
        self.preprocessings += 1
        copy = None
        if result is not None:
            copy = self.directory / f"preprocessed-{digest}.onnx"
            copy_model(result, copy)
        self._preprocessed[digest] = Preprocessed(copy, list(warnings))


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
