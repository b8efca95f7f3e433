"""Two ONNX models timed side by side: interleaved calls, warm-up, medians, the ratio.

A thin stand-in for pipeline/optimize/measure.py (a stage, which a stage may not import): both
models run in one window, alternating which goes first, so load from elsewhere lands on both alike
and the ratio of medians holds when the milliseconds do not. Each model gets its own random inputs
(its dtypes, symbolic dims at 1), so a renamed input is still timed. Only `session.run` is inside
the clock, with the garbage collector off so a collection is never charged to one model.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from pipeline.verify.session import create_session

WARMUP = 5  # calls per model before timing: first calls allocate and pick kernels
MIN_ROUNDS = 20  # even when `seconds` is tiny, enough samples for a median


@dataclass(frozen=True)
class SideBySide:
    """Both models' median milliseconds per call at batch 1, timed in the same rounds."""

    baseline_p50_ms: float
    candidate_p50_ms: float
    rounds: int

    @property
    def ratio(self) -> float:
        return self.candidate_p50_ms / self.baseline_p50_ms


def feeds_for(session: ort.InferenceSession, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Batch-1 inputs for every input of `session`: symbolic or unknown dims at 1."""
    feeds = {}
    for node in session.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in node.shape]
        kind = node.type.removeprefix("tensor(").removesuffix(")")  # tensor(float) -> float
        dtype = np.dtype({"float": "float32", "double": "float64"}.get(kind, kind))
        if dtype.kind in "iu":
            feeds[node.name] = rng.integers(0, 2, size=shape).astype(dtype)
        else:
            feeds[node.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def time_side_by_side(baseline: Path, candidate: Path, seconds: float = 2.0, threads: int = 1) -> SideBySide:
    """p50 latency at batch 1 of both models, timed interleaved for about `seconds` in all."""
    sessions = [
        create_session(p, "cpu", intra_op_threads=threads, inter_op_threads=1, spin=False)
        for p in (baseline, candidate)
    ]
    rng = np.random.default_rng(0)
    feeds = [feeds_for(s, rng) for s in sessions]
    for session, feed in zip(sessions, feeds, strict=True):
        for _ in range(WARMUP):
            session.run(None, feed)
    samples: list[list[int]] = [[], []]
    gc.collect()
    gc.disable()
    try:
        deadline, rounds = time.perf_counter() + seconds, 0
        while rounds < MIN_ROUNDS or time.perf_counter() < deadline:
            for i in (0, 1) if rounds % 2 == 0 else (1, 0):
                start = time.perf_counter_ns()
                sessions[i].run(None, feeds[i])
                samples[i].append(time.perf_counter_ns() - start)
            rounds += 1
    finally:
        gc.enable()
    base, cand = (float(np.median(s)) / 1e6 for s in samples)
    return SideBySide(baseline_p50_ms=base, candidate_p50_ms=cand, rounds=rounds)
