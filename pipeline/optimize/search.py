"""`--quantize auto`: the fastest quantized model within the accuracy budget, or the closest one to it.

Every candidate setting is quantized and judged by the caller's judge (the verifier against
fp32). The candidates that load are then timed side by side with the fp32 model in one run
(measure.py), so their speeds compare, and the fastest passing one is kept: p50 at batch 1, ties
broken at batch 32.

When none passes, the one closest to the budget (largest margin) is repaired greedily: the node
adding the most error (sensitivity.py, fp32 and quantized activations compared node by node) is
left in fp32, the model is quantized again and judged, and the ranking is redone on the new model,
until the budget holds or `max_exclusions` nodes are out. Tools that emit nothing when the goal
is missed leave users with no model and no reason; here a miss still returns the closest model
(passed=False), every trial with its figure, and each exclusion with the error that condemned it.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.errors import ArtifactError, PipelineError
from pipeline.optimize.graph import load
from pipeline.optimize.judge import Verdict
from pipeline.optimize.nodes import name_nodes, quantizable_nodes
from pipeline.optimize.quantize import QuantSettings, quantize
from pipeline.optimize.sensitivity import NodeScore, sensitivity
from pipeline.runtime.latency import measure
from pipeline.verify.report import GateReport, Row

REPAIR_FAMILIES = 3  # the closest candidates re-tried with each exclusion (a node left in fp32 can turn
# a per-channel setting from a miss into a pass where the closest per-tensor one still misses)
SENSITIVITY_SAMPLES = 64  # real samples compared node by node: enough to rank nodes, cheap on a big model
SPEED_BATCHES = (1, 32)  # the batches candidates are timed at: p50 at the first decides, the second breaks ties
Say = Callable[[str], None]


@dataclass
class Trial:
    """One quantized model the search made and judged."""

    name: str  # the settings in words, plus the nodes left in fp32
    settings: QuantSettings
    verdict: Verdict
    path: Path  # the quantized file (absent when quantization itself failed: see verdict.detail)
    size: int  # bytes; 0 when no file was made
    excluded: tuple[str, ...] = ()  # nodes the search left in fp32 (beyond the settings' own)
    latency: dict[str, float] | None = None  # Latency.to_dict(), timed beside fp32; None: not timed
    warnings: list[str] = field(default_factory=list)  # what quantize reported doing otherwise than asked

    def speed_key(self) -> tuple[float, ...]:
        """What "fastest" means: p50 at batch 1, then at batch 32 (untimed: slowest).

        A model whose inputs fix the batch ran at that batch only: its p50 there comes last.
        """
        latency = self.latency or {}
        fixed = latency.get("fixed_batch")
        return (
            *(latency.get(f"p50_ms_b{b}", math.inf) for b in SPEED_BATCHES),
            latency.get(f"p50_ms_b{int(fixed)}", math.inf) if fixed else math.inf,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "settings": self.settings.to_dict(),
            "verdict": {
                "passed": self.verdict.passed,
                "figure": _finite(self.verdict.figure),
                "margin": _finite(self.verdict.margin),
                "detail": self.verdict.detail,
            },
            "file": self.path.name if self.size else None,
            "size": self.size,
            "excluded": list(self.excluded),
            "latency": self.latency,
            "warnings": self.warnings,
        }


@dataclass(frozen=True)
class Exclusion:
    """A node the search left in fp32, and the error that condemned it."""

    node: str
    op_type: str
    score: float  # the relative error it added in the model it was ranked on
    why: str  # one line: the error at its output against the error at its inputs, and which trial

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "op_type": self.op_type, "score": _finite(self.score), "why": self.why}


@dataclass
class SearchResult:
    """What the search kept, whether it is within budget, and everything it tried on the way."""

    chosen: Trial  # the fastest passing trial, else the one closest to the budget (best effort)
    passed: bool
    tried: list[Trial]
    exclusions: list[Exclusion] = field(default_factory=list)
    reference_latency: dict[str, float] | None = None  # the fp32 model, timed in the same run
    notes: list[str] = field(default_factory=list)  # why the search stopped where it did

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "chosen": self.chosen.name,
            "tried": [t.to_dict() for t in self.tried],
            "exclusions": [e.to_dict() for e in self.exclusions],
            "reference_latency": self.reference_latency,
            "notes": self.notes,
        }


def default_candidates(task: str, has_calibration: bool) -> list[QuantSettings]:
    """The settings `--quantize auto` tries, cheapest to make first.

    Dynamic int8 needs no data: per tensor, per channel (one scale per output channel, which
    rescues layers whose channels differ in range), per channel with 7-bit weights (CPUs without
    VNNI saturate 8-bit products). Static QDQ int8 needs calibration samples: every calibration
    method with unsigned and signed activations; a detector's keep its decode tail in fp32
    (nodes.decode_tail: one int8 scale cannot hold pixel boxes and 0..1 scores).
    """
    candidates = [
        QuantSettings(mode="dynamic"),
        QuantSettings(mode="dynamic", per_channel=True),
        QuantSettings(mode="dynamic", per_channel=True, reduce_range=True),
    ]
    if has_calibration:
        candidates += [
            QuantSettings(
                mode="static",
                per_channel=True,
                activation_type=activations,
                calibration=method,
                float_tail=task == "detection",
            )
            for method in ("minmax", "entropy", "percentile")
            for activations in ("uint8", "int8")
        ]
    return candidates


def auto_search(
    src: Path,
    workdir: Path,
    candidates: Sequence[QuantSettings],
    calibration: Mapping[str, np.ndarray] | None,
    judge: Callable[[Path], Verdict],
    samples: Mapping[str, np.ndarray],
    max_exclusions: int = 8,
    threads: int = 1,
    progress: Say | None = None,
    seconds: float = 1.0,
) -> SearchResult:
    """Try `candidates` on the fp32 model `src`; keep the fastest within budget, else repair the closest.

    `judge` says whether a quantized file is within the budget (pipeline.optimize.judge.Judge is
    one). `calibration`: real samples for static candidates (without them a static candidate is a
    failed trial that says so). `samples`: real inputs, timed for speed and compared node by node. Files go to
    `workdir`. Raises ArtifactError when no candidate could be quantized at all; any other miss is
    a result with passed=False.
    """
    if not candidates:
        raise ArtifactError("the auto search was given no candidate settings; give at least one")
    say = progress or (lambda _message: None)
    search = _Search(src, workdir, calibration, judge, say)
    for settings in candidates:
        search.attempt(settings)
    made = [t for t in search.tried if t.size]
    if not made:
        raise ArtifactError(
            "no candidate could be quantized:\n  " + "\n  ".join(f"{t.name}: {t.verdict.detail}" for t in search.tried)
        )
    if not any(t.verdict.passed for t in search.tried):
        # Closest first; on a tie, per-channel first: its weights cannot hide a wide row, so what
        # error is left is the activations', which leaving a node in fp32 repairs.
        ranked = sorted(made, key=lambda t: (t.verdict.margin, t.settings.per_channel), reverse=True)
        others = [t.settings for t in ranked[1:REPAIR_FAMILIES]]
        search.exclude(ranked[0], samples, max_exclusions, threads, others)
    search.prune()
    reference = search.time(samples, threads, seconds)
    passing = [t for t in search.tried if t.verdict.passed]
    if passing:
        chosen = min(passing, key=Trial.speed_key)
        say(f"kept {chosen.name}: the fastest of {len(passing)} within budget ({_speed(chosen)})")
    else:
        chosen = max((t for t in search.tried if t.size), key=lambda t: t.verdict.margin)
        say(f"no candidate met the budget; best effort: {chosen.name} ({chosen.verdict.detail})")
    return SearchResult(chosen, bool(passing), search.tried, search.exclusions, reference, search.notes)


class _Search:
    """The search's state: where files go, what was tried and excluded, and how to report it."""

    def __init__(
        self,
        src: Path,
        workdir: Path,
        calibration: Mapping[str, np.ndarray] | None,
        judge: Callable[[Path], Verdict],
        say: Say,
    ) -> None:
        self.src, self.workdir, self.calibration, self.judge, self.say = src, workdir, calibration, judge, say
        self.scratch = workdir / "scratch"
        self.scratch.mkdir(parents=True, exist_ok=True)
        model = load(src)
        name_nodes(model)  # the names quantize gives unnamed nodes, which nodes_to_exclude takes
        self.names = {node.name for node in model.graph.node}
        self.tried: list[Trial] = []
        self.sources: dict[Path, Path] = {}  # a trial's file -> the fp32 graph quantize made it from
        self.exclusions: list[Exclusion] = []
        self.notes: list[str] = []

    def attempt(self, settings: QuantSettings, excluded: tuple[str, ...] = ()) -> Trial:
        """Quantize `src` with `settings` and judge it; a failure to quantize is a failed trial, not a crash."""
        number = len(self.tried) + 1
        name = settings.describe()
        path = self.workdir / f"trial{number:02d}.onnx"
        scratch = self.workdir / f"trial{number:02d}.scratch"  # kept: the exclusion step reads its fp32 graph
        warnings: list[str] = []
        self.say(f"[{number}] quantizing {name}")
        try:
            report = quantize(self.src, path, settings, self.calibration if settings.mode == "static" else None,
                              scratch, progress=self._calibrating(number))  # fmt: skip
        except PipelineError as exc:  # e.g. static without calibration data, or onnxruntime refusing the graph
            verdict = _failed(f"quantization failed: {exc}")
        else:
            warnings = list(report.warnings)
            for warning in warnings:
                self.say(f"[{number}] {warning}")
            self.sources[path] = scratch / ("preprocessed.onnx" if report.preprocessed else "named.onnx")
            self.say(f"[{number}] judging {name}")
            verdict = self.judge(path)
            if not report.quantized:  # every candidate node excluded: an fp32 copy, not a quantized model
                kept = len(report.left_float)
                verdict = _failed(f"nothing left quantized ({kept} node(s) in fp32); {verdict.detail}")
        size = path.stat().st_size if path.exists() else 0
        trial = Trial(name, settings, verdict, path, size, excluded, warnings=warnings)
        self.say(f"[{number}] {name}: {'within budget' if verdict.passed else 'MISSED'}: {verdict.detail}")
        self.tried.append(trial)
        return trial

    def exclude(
        self,
        start: Trial,
        samples: Mapping[str, np.ndarray],
        limit: int,
        threads: int,
        others: Sequence[QuantSettings] = (),
    ) -> None:
        """Leave the worst node of `start` in fp32, re-quantize, judge; repeat until within budget or `limit`.

        Each exclusion is also tried with the `others` settings (the next closest candidates): the
        closest trial of the step, by margin, is the one ranked for the next exclusion.
        """
        self.say(f"no candidate met the budget; repairing the closest, {start.name} ({start.verdict.detail})")
        self.prune(keep=start)
        inputs = {k: v[:SENSITIVITY_SAMPLES] for k, v in samples.items()}
        current, excluded = start, start.excluded
        while not current.verdict.passed:
            if len(excluded) >= limit:
                self.notes.append(f"stopped after {len(excluded)} exclusion(s): max_exclusions is {limit}")
                self.say(self.notes[-1])
                break
            worst = self._worst(current, inputs, {*excluded, *start.settings.nodes_to_exclude}, threads)
            if worst is None:
                break
            node, score = worst
            self.say(f"excluding {node} ({score.op_type}, adds relative error {score.score:.3g})")
            where = f" (as {score.node} after pre-processing)" if score.node != node else ""
            self.exclusions.append(
                Exclusion(node, score.op_type, score.score, f"{score.why()} in {current.name}{where}")
            )
            excluded = (*excluded, node)
            step = []
            for base in (start.settings, *others):
                settings = replace(base, nodes_to_exclude=(*base.nodes_to_exclude, *excluded))
                step.append(self.attempt(settings, excluded))
                if step[-1].verdict.passed:
                    break
            made = [t for t in step if t.size]
            if not made:  # quantization itself failed: nothing left to rank
                self.notes.append(f"stopped: {step[0].verdict.detail}")
                break
            current = max(made, key=lambda t: (t.verdict.passed, t.verdict.margin, t.settings.per_channel))
            self.prune(keep=current)

    def _worst(
        self, trial: Trial, inputs: Mapping[str, np.ndarray], skip: set[str], threads: int
    ) -> tuple[str, NodeScore] | None:
        """The node of `trial` adding the most error, by its name in `src`; None (and a note) when none helps.

        Pre-processing fuses nodes (`fc/MatMul` + `fc/Add` -> `fc/MatMul/MatMulAddFusion`), so nodes are
        ranked in the graph quantize worked on and named back as they are in `src`.
        """
        source = self.sources[trial.path]
        self.say(f"ranking the nodes of {trial.name} by the error each adds")
        candidates = set(quantizable_nodes(source, "static")) | set(quantizable_nodes(source, trial.settings.mode))
        ranked = sensitivity(source, trial.path, inputs, self.scratch, nodes=candidates, threads=threads)
        named = [(name, score) for score in ranked if (name := self._source_name(score.node)) and name not in skip]
        if not named:
            self.notes.append(f"stopped: no node of {trial.name} left to exclude could be compared with fp32")
        elif not named[0][1].score > 0:
            worst = named[0][1].score
            self.notes.append(
                f"stopped: no node of {trial.name} adds error (the worst adds {worst:.3g}); leaving more in fp32 "
                "cannot help"
            )
        else:
            return named[0]
        self.say(self.notes[-1])
        return None

    def _source_name(self, node: str) -> str | None:
        """`node`'s name in `src`: itself, or the longest `src` name it extends with "/" (a fusion's)."""
        if node in self.names:
            return node
        prefixes = [name for name in self.names if node.startswith(f"{name}/")]
        return max(prefixes, key=len) if prefixes else None

    def prune(self, keep: Trial | None = None) -> None:
        """Delete the scratch copies of the fp32 graph that no later step reads (a large model has one per trial)."""
        for path, source in list(self.sources.items()):
            if keep is None or path != keep.path:
                shutil.rmtree(source.parent, ignore_errors=True)
                del self.sources[path]

    def time(self, samples: Mapping[str, np.ndarray], threads: int, seconds: float) -> dict[str, float]:
        """Time every trial that made a runnable file beside the fp32 model, in one run; the fp32 timings."""
        timed = {f"trial{i:02d}": t for i, t in enumerate(self.tried, 1) if t.size and math.isfinite(t.verdict.figure)}
        self.say(f"timing {len(timed)} candidate(s) beside fp32 ({threads} thread)")
        models = {"fp32": self.src, **{key: t.path for key, t in timed.items()}}
        results = measure(models, dict(samples), batches=SPEED_BATCHES, threads=threads, seconds=seconds,
                          progress=self.say)  # fmt: skip
        for key, trial in timed.items():
            trial.latency = results[key].to_dict()
        return results["fp32"].to_dict()

    def _calibrating(self, number: int) -> Callable[[int, int], None]:
        def report(done: int, total: int) -> None:
            if done == total or done % max(1, total // 4) == 0:
                self.say(f"[{number}] calibrating {done}/{total} samples")

        return report


def _failed(detail: str) -> Verdict:
    """The verdict of a candidate that produced no model to judge."""
    return Verdict(False, math.nan, -math.inf, detail, GateReport([Row("quantize", "-", False, detail)]))


def _speed(trial: Trial) -> str:
    latency = trial.latency or {}
    p50s = [(key.removeprefix("p50_ms_b"), ms) for key, ms in latency.items() if key.startswith("p50_ms_b")]
    return ", ".join(f"p50 {ms:.3g} ms at batch {batch}" for batch, ms in p50s)


def _finite(value: float) -> float | None:
    """A figure for JSON: NaN and infinities (nothing measured) become null."""
    return value if math.isfinite(value) else None
