"""Latency of several models timed side by side, in one run: ONNX files on onnxruntime's CPU provider,
or any loaded model called the way an onnxruntime session is (`Session`: pipe benchmark's torch and
LiteRT rows).

The machines this runs on are shared and noisy, so a variant is never timed alone and compared
with a number taken minutes earlier. All models are timed in the same window, interleaved: each
round runs every model once, in a fresh random order (seeded, so a run is repeatable: a fixed
rotation would leave each model behind the same neighbour most of the time, and a model after a
cache-thrashing one was measured 10-17% slower for it; `rounds.py`), and rounds go on until every model has
`seconds` of samples. A burst of load
from elsewhere then lands on every model alike, and the ratios between them hold even when the
absolute milliseconds do not.

Only `session.run` is inside the clock (`time.perf_counter_ns`); feeds are built once per batch.
The garbage collector is off while a batch is timed: a collection is triggered by allocations
anywhere, and the pass would be charged to whichever model happened to be running, a bias on one
model rather than noise shared by all. Nothing timed makes reference cycles (outputs are numpy
arrays freed by reference counting), so nothing piles up meanwhile; one collection runs before.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from pipeline.core.errors import ArtifactError, InputError, first_line
from pipeline.runtime.rounds import interleaved, timing_problems
from pipeline.runtime.sample_axes import SampleAxes
from pipeline.runtime.session import create_session


class InputSpec(Protocol):
    """One input as a Session declares it (onnxruntime's NodeArg has both)."""

    @property
    def name(self) -> str: ...

    @property
    def shape(self) -> Sequence[Any]: ...  # an int at the batch axis fixes the batch; a str or None leaves it free


class Session(Protocol):
    """What is timed: an onnxruntime InferenceSession, or another runtime's model wrapped to be called alike."""

    def get_inputs(self) -> Sequence[InputSpec]: ...

    def run(self, output_names: None, feed: dict[str, np.ndarray], /) -> Any: ...


@dataclass(frozen=True)
class BatchLatency:
    """One model's timings at one batch size."""

    batch: int
    p50_ms: float  # median of the timed runs
    p95_ms: float
    mean_ms: float
    runs: int  # timed runs (warm-up runs excluded)
    throughput: float  # samples per second at this batch: batch / mean seconds

    @classmethod
    def from_samples(cls, batch: int, samples_ns: list[int]) -> BatchLatency:
        ms = np.asarray(samples_ns, dtype=np.float64) / 1e6
        mean = float(ms.mean())
        return cls(
            batch=batch,
            p50_ms=float(np.percentile(ms, 50)),
            p95_ms=float(np.percentile(ms, 95)),
            mean_ms=mean,
            runs=len(samples_ns),
            throughput=batch / (mean / 1e3),
        )


@dataclass(frozen=True)
class Latency:
    """One model's latency at each batch it ran at, and how it was measured."""

    batches: dict[int, BatchLatency]  # batch size -> timings
    threads: int  # the threads the model ran with (onnxruntime: intra-op threads)
    fixed_batch: int | None = None  # the model's inputs fix the batch: it ran at this batch only
    skipped: tuple[int, ...] = field(default=())  # batches asked for that a fixed batch ruled out

    def at(self, batch: int) -> BatchLatency:
        """The timings at `batch`; InputError naming the batches measured when it did not run there."""
        if batch not in self.batches:
            why = f" (its batch dimension is fixed at {self.fixed_batch})" if self.fixed_batch is not None else ""
            raise InputError(f"no latency at batch {batch}{why}; measured at {sorted(self.batches)}")
        return self.batches[batch]

    def to_dict(self) -> dict[str, float]:
        """Flat keys for a variant record's `latency`: p50_ms_b1, p95_ms_b1, mean_ms_b1, throughput_b1, runs_b1, ...

        `threads` always, and `fixed_batch` when the model could run at that batch only.
        """
        flat: dict[str, float] = {}
        for batch, timing in sorted(self.batches.items()):
            flat[f"p50_ms_b{batch}"] = timing.p50_ms
            flat[f"p95_ms_b{batch}"] = timing.p95_ms
            flat[f"mean_ms_b{batch}"] = timing.mean_ms
            flat[f"throughput_b{batch}"] = timing.throughput
            flat[f"runs_b{batch}"] = float(timing.runs)
        flat["threads"] = float(self.threads)
        if self.fixed_batch is not None:
            flat["fixed_batch"] = float(self.fixed_batch)
        return flat


def speedup(baseline: Latency, other: Latency, batch: int) -> float:
    """How many times faster `other` is than `baseline` at `batch`: the ratio of their p50s (> 1: faster)."""
    return baseline.at(batch).p50_ms / other.at(batch).p50_ms


def affordable_batches(
    path: Path,
    inputs: dict[str, np.ndarray],
    batches: tuple[int, ...] = (1, 32),
    threads: int = 1,
    max_run_seconds: float = 0.05,
    max_bytes: int = 64 << 20,
) -> tuple[int, ...]:
    """The batches of `batches` worth timing the model at `path` at: batch 1 always, a larger one
    when one run of it would take at most `max_run_seconds` (estimated as that many batch-1 runs,
    the fastest of 3) and its inputs at most `max_bytes`.

    A timing needs 10 runs or more per model, several models are timed side by side, and the search
    times several groups: 32 pictures at 224x224 through a conv net are a quarter second a run on
    one thread, which would spend the search's time on one figure that only breaks ties. A model
    whose inputs fix the batch keeps `batches` as given: `measure` times it at its own batch.
    """
    session = create_session(path, "cpu", intra_op_threads=threads, inter_op_threads=1)
    if _fixed_batch(str(path), session) is not None:
        return batches
    feed = _feed(str(path), session, inputs, 1)
    per_sample = sum(array.nbytes for array in feed.values())
    runs = []
    for _ in range(3):
        begin = time.perf_counter()
        _run(str(path), session, feed, 1)
        runs.append(time.perf_counter() - begin)
    one = min(runs)
    return tuple(b for b in batches if b == 1 or (b * one <= max_run_seconds and b * per_sample <= max_bytes))


def measure(
    models: dict[str, Path],
    inputs: dict[str, np.ndarray],
    batches: tuple[int, ...] = (1, 32),
    threads: int = 1,
    seconds: float = 1.0,
    warmup: int = 3,
    min_runs: int = 10,
    max_runs: int = 2000,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Latency]:
    """Each model's latency at each batch, all models timed side by side in one run.

    `inputs` are real samples, batch first, by input name; batch b feeds the first b rows
    (repeated when there are fewer). Each model gets its own CPU session with `threads` intra-op
    threads, made once before any timing. Per batch, rounds run every model once until each has
    `seconds` of timed runs and at least `min_runs`, or `max_runs`. A model whose inputs fix the
    batch dimension runs at that batch only, and its Latency says so (`fixed_batch`, `skipped`);
    when that batch is not among `batches`, the other models are timed there too, beside it.
    """
    _check_settings(list(models), inputs, batches, threads, seconds, warmup, min_runs, max_runs)
    sessions = {
        name: create_session(path, "cpu", intra_op_threads=threads, inter_op_threads=1) for name, path in models.items()
    }
    return _measure(sessions, inputs, batches, threads, seconds, warmup, min_runs, max_runs, progress)


def measure_sessions(
    sessions: Mapping[str, Session],
    inputs: dict[str, np.ndarray],
    batches: tuple[int, ...] = (1, 32),
    threads: int = 1,
    seconds: float = 1.0,
    warmup: int = 3,
    min_runs: int = 10,
    max_runs: int = 2000,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Latency]:
    """`measure` for models already loaded, of any runtime wrapped as a `Session`, timed side by side.

    The caller made each with `threads` threads (recorded in every Latency); the rest is as in
    `measure`: the same inputs, batches, interleaved rounds and fixed-batch handling.
    """
    _check_settings(list(sessions), inputs, batches, threads, seconds, warmup, min_runs, max_runs)
    return _measure(dict(sessions), inputs, batches, threads, seconds, warmup, min_runs, max_runs, progress)


def _measure(
    sessions: dict[str, Session],
    inputs: dict[str, np.ndarray],
    batches: tuple[int, ...],
    threads: int,
    seconds: float,
    warmup: int,
    min_runs: int,
    max_runs: int,
    progress: Callable[[str], None] | None,
) -> dict[str, Latency]:
    """Time `sessions` (settings already checked) batch by batch, interleaved; see `measure`."""
    say = progress or (lambda _message: None)
    models = list(sessions)
    fixed = {name: _fixed_batch(name, session) for name, session in sessions.items()}
    samples: dict[str, dict[int, list[int]]] = {name: {} for name in models}
    for batch in sorted(set(batches) | {b for b in fixed.values() if b is not None}):
        here = [name for name in models if fixed[name] in (None, batch)]
        if not here:  # every model fixes a batch other than this one
            continue
        feeds = {name: _feed(name, sessions[name], inputs, batch) for name in here}
        say(f"latency: timing {len(here)} model(s) at batch {batch}, {seconds:g} s of runs each")
        timed = _time_interleaved(
            {name: sessions[name] for name in here}, feeds, batch, seconds, warmup, min_runs, max_runs
        )
        for name, runs in timed.items():
            samples[name][batch] = runs
    results: dict[str, Latency] = {}
    for name in models:
        per_batch = {batch: BatchLatency.from_samples(batch, runs) for batch, runs in samples[name].items()}
        skipped = tuple(b for b in batches if b != fixed[name]) if fixed[name] is not None else ()
        results[name] = Latency(per_batch, threads, fixed[name], skipped)
        if skipped:
            say(f"latency: {name} has a fixed batch of {fixed[name]}; not timed at batch {list(skipped)}")
    return results


def _time_interleaved(
    sessions: dict[str, Session],
    feeds: dict[str, dict[str, np.ndarray]],
    batch: int,
    seconds: float,
    warmup: int,
    min_runs: int,
    max_runs: int,
) -> dict[str, list[int]]:
    """Nanoseconds per `session.run`, per model, from rounds that run every unfinished model once (rounds.py)."""
    names = list(sessions)
    for _ in range(warmup):
        for name in names:
            _run(name, sessions[name], feeds[name], batch)

    def timed(name: str) -> tuple[int]:
        begin = time.perf_counter_ns()
        try:
            sessions[name].run(None, feeds[name])
        except Exception as exc:  # with warmup=0 a model's first run is a timed one; name it like _run does
            raise ArtifactError(f"model {name!r} failed to run at batch {batch}: {first_line(exc)}") from exc
        return (time.perf_counter_ns() - begin,)

    runs = interleaved(names, timed, seconds, min_runs, max_runs)
    return {name: [elapsed for (elapsed,) in runs[name]] for name in names}


def _run(name: str, session: Session, feed: dict[str, np.ndarray], batch: int) -> None:
    """One untimed run (warm-up); a model that cannot run on these inputs is an ArtifactError."""
    try:
        session.run(None, feed)
    except Exception as exc:  # onnxruntime's exception types share no base class
        raise ArtifactError(f"model {name!r} failed to run at batch {batch}: {first_line(exc)}") from exc


def _feed(name: str, session: Session, inputs: dict[str, np.ndarray], batch: int) -> dict[str, np.ndarray]:
    """The model's inputs at `batch`: the first `batch` samples, repeated when there are fewer, contiguous, each
    with its samples on the input's batch axis (`inputs` lead with them; Silero VAD's state keeps them on axis 1)."""
    axes = model_axes(session)
    feed: dict[str, np.ndarray] = {}
    for spec in session.get_inputs():
        if spec.name not in inputs:
            raise InputError(f"model {name!r} needs input {spec.name!r}; the samples hold {sorted(inputs)}")
        feed[spec.name] = batch_of(inputs[spec.name], batch)
    return {k: np.ascontiguousarray(v) for k, v in axes.to_model(feed).items()}


def batch_of(samples: np.ndarray, batch: int) -> np.ndarray:
    """`batch` rows of `samples`, contiguous: the first ones, repeated when there are fewer (0, 1, ..., n-1, 0, ...)."""
    rows = np.resize(np.arange(len(samples)), batch)
    return np.ascontiguousarray(samples[rows])


def model_axes(session: Session) -> SampleAxes:
    """Where a model keeps its samples: an onnxruntime session's `pipe.sample_axes` stamp (pipe import wrote it
    for a batch on another axis, sample_axes.py); a model of another runtime takes them first."""
    meta = getattr(session, "get_modelmeta", None)
    return SampleAxes.read(meta().custom_metadata_map) if callable(meta) else SampleAxes()


def _fixed_batch(name: str, session: Session) -> int | None:
    """The batch size the model's inputs fix (a number at an input's batch axis), or None when it is free.

    The batch axis is the input's own (`model_axes`): Silero VAD's state [2, batch, 128] fixes nothing,
    where reading its first dim took the model for one of fixed batch 2."""
    axes = model_axes(session)
    fixed = set()
    for spec in session.get_inputs():
        axis = axes.inputs.get(spec.name, 0)
        if len(spec.shape) > axis and isinstance(spec.shape[axis], int):
            fixed.add(spec.shape[axis])
    if len(fixed) > 1:
        raise ArtifactError(f"model {name!r}: its inputs fix different batch sizes {sorted(fixed)}")
    return fixed.pop() if fixed else None


def _check_settings(
    models: list[str],
    inputs: dict[str, np.ndarray],
    batches: tuple[int, ...],
    threads: int,
    seconds: float,
    warmup: int,
    min_runs: int,
    max_runs: int,
) -> None:
    """Refuse settings that would time nothing, or forever, before any session is made."""
    problems = []
    if not models:
        problems.append("no models to time")
    if not batches or any(not isinstance(b, int) or b < 1 for b in batches):
        problems.append(f"batches {batches!r} must be positive integers")
    problems += timing_problems(threads, seconds, warmup, min_runs, max_runs)
    empty = [name for name, array in inputs.items() if np.ndim(array) == 0 or len(array) == 0]
    if empty:
        problems.append(f"inputs {empty} hold no samples (a batch dimension of at least 1 row is needed)")
    if problems:
        raise InputError("cannot measure latency: " + "; ".join(problems))
