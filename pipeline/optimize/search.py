"""`--quantize auto`: the fastest int8 model within the accuracy budget, or the smallest, or the closest one.

The candidates come from the graph (plan.py): families of settings that make the same kernels and
differ only in rounding, in the order the graph's weights suggest (static QDQ first for conv
nets, dynamic first for MatMul models). Each candidate is quantized and judged by the caller's judge
(the verifier against fp32). A family's first candidate that runs is timed at once beside fp32
(speed.py, in small groups so few sessions are ever resident): a family slower than fp32 is not
widened, and a family stops at its first candidate within budget (its others only round
differently). Static candidates share one pre-processing and one calibration per method
(cache.py). A time budget (`search_seconds`) cuts the search: what passed so far is kept, and the
result says what was left untried.

What is kept: the fastest passed candidate that is faster than fp32 beyond noise; when none is, the
smallest passed one, with onnxruntime's op profile of it against fp32 saying why it is not faster
(profile.py). When none passes, the candidates of families set aside for speed are tried for the
smallest model within budget, and then the one closest to the budget is repaired (repair.py: the
node adding the most error left in fp32, again and again). A miss still returns the closest model
(passed=False), every trial with its figure, and each exclusion with the error that condemned it.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.errors import ArtifactError, PipelineError
from pipeline.optimize.cache import QuantCache
from pipeline.optimize.graph import load
from pipeline.optimize.judge import Verdict
from pipeline.optimize.nodes import name_nodes
from pipeline.optimize.plan import Family
from pipeline.optimize.profile import compare_profiles
from pipeline.optimize.quantize import QuantSettings
from pipeline.optimize.quantizers import quantize
from pipeline.optimize.repair import Exclusion, repair
from pipeline.optimize.speed import Timer, choose
from pipeline.optimize.trial import NOISE, Trial, failed_verdict
from pipeline.recipe.defaults import MAX_EXCLUSIONS, SEARCH_SECONDS
from pipeline.runtime.external_data import model_bytes

REPAIR_FAMILIES = 3  # kinds of int8 (dynamic, static uint8, static int8) re-tried with each exclusion, each
# with its closest settings: a node left in fp32 can turn one kind from a miss into a pass where another still misses
Say = Callable[[str], None]


@dataclass
class SearchResult:
    """What the search kept, whether it is within budget and faster, and everything it tried on the way."""

    chosen: Trial  # see the module doc: fastest passed and faster, else smallest passed, else closest
    passed: bool
    tried: list[Trial]
    exclusions: list[Exclusion] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # why the search went and stopped where it did
    speed: str = "none passed"  # faster | not faster | none passed: the kept trial against fp32 at batch 1
    why_not_faster: str = ""  # when passed but not faster: the op profile's reason, in words
    profile: dict[str, Any] | None = None  # that profile, kind by kind (profile.Comparison.to_dict)
    cut: bool = False  # the time budget ran out before every candidate was tried
    untried: list[str] = field(default_factory=list)  # candidates the budget left out
    seconds: float = 0.0  # the search's wall time
    batches: tuple[int, ...] = (1,)  # the batches candidates were timed at
    calibrations: list[str] = field(default_factory=list)  # each calibration run (method), once per method

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "chosen": self.chosen.name,
            "speed": self.speed,
            "why_not_faster": self.why_not_faster,
            "profile": self.profile,
            "cut": self.cut,
            "untried": self.untried,
            "seconds": round(self.seconds, 2),
            "batches": list(self.batches),
            "calibrations": self.calibrations,
            "noise": NOISE,
            "tried": [t.to_dict() for t in self.tried],
            "exclusions": [e.to_dict() for e in self.exclusions],
            "reference_latency": self.chosen.fp32_latency,
            "notes": self.notes,
        }


def auto_search(
    src: Path,
    workdir: Path,
    families: Sequence[Family],
    calibration: Mapping[str, np.ndarray] | None,
    judge: Callable[[Path], Verdict],
    samples: Mapping[str, np.ndarray],
    max_exclusions: int = MAX_EXCLUSIONS,
    threads: int = 1,
    progress: Say | None = None,
    seconds: float = 1.0,
    budget: float = SEARCH_SECONDS,
    clock: Callable[[], float] = time.monotonic,
) -> SearchResult:
    """Try the `families` of settings on the fp32 model `src`; keep what the module doc says.

    `judge` says whether a quantized file is within the budget (pipeline.optimize.judge.Judge is
    one). `calibration`: real samples for static candidates (without them a static candidate is a
    failed trial that says so). `samples`: real inputs, timed for speed, profiled and compared node
    by node. `seconds`: timed runs per model, batch and group. `budget`: seconds after which no new
    candidate is started (the first is always tried). Files go to `workdir`. Raises ArtifactError
    when no candidate could be quantized at all; any other miss is a result with passed=False.
    """
    if not any(f.candidates for f in families):
        raise ArtifactError("the auto search was given no candidate settings; give at least one")
    say = progress or (lambda _message: None)
    began = clock()
    deadline = began + budget
    search = Search(src, workdir, calibration, judge, say, QuantCache(workdir / "cache"))
    timer = Timer(src, samples, threads, seconds, say)

    def out_of_time() -> bool:
        return clock() >= deadline

    untried: list[str] = []
    for family in families:
        if untried:
            untried += [c.describe() for c in family.candidates]
            continue
        untried = search.try_family(family, timer, out_of_time)
    if not any(t.verdict.passed for t in search.tried) and not untried and search.set_aside:
        untried = search.revisit(timer, out_of_time)
    made = [t for t in search.tried if t.size]
    if not made:
        raise ArtifactError(
            "no candidate could be quantized:\n  " + "\n  ".join(f"{t.name}: {t.verdict.detail}" for t in search.tried)
        )
    if not any(t.verdict.passed for t in search.tried) and not untried:
        # Closest first; on a tie, the faster (a family's first is timed), then per-channel: its weights
        # cannot hide a wide row, so what error is left is the activations', which leaving a node in fp32 repairs.
        ranked = sorted(made, key=lambda t: (t.verdict.margin, _ratio(t), t.settings.per_channel), reverse=True)
        others = _other_families(ranked)
        search.exclusions += repair(search, ranked[0], samples, max_exclusions, threads, others, out_of_time)
        timer.time([t for t in search.tried if t.verdict.passed and not t.speedup])
    search.prune()
    if untried:
        search.notes.append(
            f"the search was cut after {clock() - began:.0f} s (search_seconds {budget:g}): the best passed "
            f"candidate so far is kept; not tried: {'; '.join(untried)}"
        )
        say(search.notes[-1])
    choice = choose(search.tried)
    chosen = choice.trial or _closest([t for t in search.tried if t.size])
    result = SearchResult(chosen, choice.trial is not None, search.tried, search.exclusions, search.notes, choice.speed)
    result.cut, result.untried, result.batches = bool(untried), untried, timer.batches
    result.calibrations = list(search.cache.computed) if search.cache else []
    if choice.speed == "faster":
        say(f"kept {chosen.name}: the fastest within budget ({_speed(chosen)})")
    elif choice.trial is not None:
        comparison = compare_profiles(src, chosen.path, samples, threads, workdir / "profile")
        result.profile = comparison.to_dict()
        result.why_not_faster = _not_faster(chosen, model_bytes(src), comparison.why())
        say(f"kept {chosen.name}: {result.why_not_faster}")
    else:
        say(f"no candidate met the budget; best effort: {chosen.name} ({chosen.verdict.detail})")
    result.seconds = clock() - began
    return result


def _other_families(ranked: list[Trial]) -> list[QuantSettings]:
    """The closest settings of each other kind of int8 than `ranked[0]`'s, closest kind first."""
    seen, others = {_kind(ranked[0].settings)}, []
    for trial in ranked[1:]:
        if _kind(trial.settings) not in seen and len(others) < REPAIR_FAMILIES - 1:
            seen.add(_kind(trial.settings))
            others.append(trial.settings)
    return others


def _kind(settings: QuantSettings) -> tuple[str, str]:
    return settings.mode, settings.activation_type if settings.mode == "static" else ""


def _closest(made: list[Trial]) -> Trial:
    return max(made, key=lambda t: (t.verdict.margin, _ratio(t)))


def _ratio(trial: Trial) -> float:
    """The trial's speed against fp32 at its first timed batch; 0 when untimed."""
    return trial.speedup[min(trial.speedup)] if trial.speedup else 0.0


def _not_faster(trial: Trial, fp32_size: int, why: str) -> str:
    """The plain statement a card shows: smaller (or not), not faster on this CPU, and the profile's reason."""
    batch = min(trial.speedup) if trial.speedup else 1
    ratio = trial.speedup.get(batch)
    speed = f"{ratio:.2f}x fp32's speed at batch {batch}" if ratio is not None else "not timed"
    size = trial.size / fp32_size if fp32_size else 1.0
    smaller = (
        f"smaller ({size:.2f}x the size of model.onnx) but not faster"
        if size < 1
        else f"neither smaller ({size:.2f}x the size of model.onnx: the quantization parameters outweigh the int8 "
        "weights saved) nor faster"
    )
    return f"{smaller} on this CPU: {speed}, where faster means {1 + NOISE:.2f}x or more. Why, from {why}"


class Search:
    """The search's state: where files go, what was tried and excluded, and how to report it."""

    def __init__(
        self,
        src: Path,
        workdir: Path,
        calibration: Mapping[str, np.ndarray] | None,
        judge: Callable[[Path], Verdict],
        say: Say,
        cache: QuantCache | None = None,
    ) -> None:
        self.src, self.workdir, self.calibration, self.judge, self.say = src, workdir, calibration, judge, say
        self.cache = cache
        self.scratch = workdir / "scratch"
        self.scratch.mkdir(parents=True, exist_ok=True)
        model = load(src)
        name_nodes(model)  # the names quantize gives unnamed nodes, which nodes_to_exclude takes
        self.names = {node.name for node in model.graph.node}
        self.tried: list[Trial] = []
        self.sources: dict[Path, Path] = {}  # a trial's file -> the fp32 graph quantize made it from
        self.exclusions: list[Exclusion] = []
        self.notes: list[str] = []
        self.set_aside: list[tuple[Family, tuple[QuantSettings, ...]]] = []  # families not widened, what is left

    def note(self, message: str) -> None:
        """Record why the search went or stopped where it did (the report's notes), and say it."""
        self.notes.append(message)
        self.say(message)

    def graph_of(self, trial: Trial) -> Path:
        """The fp32 graph quantize made `trial` from (kept until pruned)."""
        return self.sources[trial.path]

    def name_in_source(self, node: str) -> str | None:
        """`node`'s name in `src`: itself, or the longest `src` name it extends with "/" (a fusion's)."""
        if node in self.names:
            return node
        prefixes = [name for name in self.names if node.startswith(f"{name}/")]
        return max(prefixes, key=len) if prefixes else None

    def try_family(self, family: Family, timer: Timer, out_of_time: Callable[[], bool]) -> list[str]:
        """Try `family`'s candidates in order until one passes; time its first that runs at once and stop
        the family there when it is slower than fp32. Returns the candidates left untried for lack of time."""
        self.say(f"family {family.name}: {family.why}")
        first = True
        for index, settings in enumerate(family.candidates):
            if self.tried and out_of_time():
                return [c.describe() for c in family.candidates[index:]]
            trial = self.attempt(settings)
            timed = first and trial.size > 0 and math.isfinite(trial.verdict.figure)
            if timed or (trial.verdict.passed and not trial.speedup):
                timer.time([trial])
            first = first and not timed
            rest = len(family.candidates) - index - 1
            if timed and trial.speed == "slower":
                if rest:
                    ratio = trial.speedup[min(trial.speedup)]
                    self.notes.append(
                        f"family {family.name}: not widened: {trial.name} runs at {ratio:.2f}x fp32's speed, slower "
                        f"beyond the {NOISE:.0%} noise band, and its other {rest} candidate(s) make the same kernels"
                    )
                    self.say(self.notes[-1])
                    if not trial.verdict.passed:  # its others may still be the smallest model within budget
                        self.set_aside.append((family, family.candidates[index + 1 :]))
                return []
            if trial.verdict.passed:
                if rest:
                    self.notes.append(
                        f"family {family.name}: {trial.name} met the budget; its other {rest} candidate(s) make the "
                        "same kernels and only round differently: not tried"
                    )
                return []
        return []

    def revisit(self, timer: Timer, out_of_time: Callable[[], bool]) -> list[str]:
        """When nothing passed: the candidates of the families set aside for speed, for the smallest int8 model
        within budget (none is faster), until one passes. Returns those left untried for lack of time."""
        self.say("no candidate met the budget and none was faster than fp32: trying the candidates set aside for "
                 "speed, for the smallest int8 model within budget")  # fmt: skip
        for number, (family, rest) in enumerate(self.set_aside):
            for index, settings in enumerate(rest):
                if out_of_time():
                    later = [c for _, more in self.set_aside[number + 1 :] for c in more]
                    return [c.describe() for c in (*rest[index:], *later)]
                trial = self.attempt(settings)
                if trial.verdict.passed:
                    timer.time([trial])
                    self.notes.append(
                        f"family {family.name}: {trial.name} met the budget once nothing else had: kept as the "
                        "smallest int8 model within budget, not for speed"
                    )
                    return []
        return []

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
                              scratch, progress=self._calibrating(number), cache=self.cache)  # fmt: skip
        except PipelineError as exc:  # e.g. static without calibration data, or onnxruntime refusing the graph
            verdict = failed_verdict(f"quantization failed: {exc}")
        else:
            warnings = list(report.warnings)
            for warning in warnings:
                self.say(f"[{number}] {warning}")
            self.sources[path] = scratch / ("preprocessed.onnx" if report.preprocessed else "named.onnx")
            self.say(f"[{number}] judging {name}")
            verdict = self.judge(path)
            if not report.quantized:  # every candidate node excluded: an fp32 copy, not a quantized model
                kept = len(report.left_float)
                verdict = failed_verdict(f"nothing left quantized ({kept} node(s) in fp32); {verdict.detail}")
        size = model_bytes(path) if path.exists() else 0  # with its external data
        trial = Trial(name, settings, verdict, path, size, excluded, warnings=warnings)
        self.say(f"[{number}] {name}: {'within budget' if verdict.passed else 'MISSED'}: {verdict.detail}")
        self.tried.append(trial)
        return trial

    def prune(self, keep: Trial | None = None) -> None:
        """Delete the scratch copies of the fp32 graph that no later step reads (a large model has one per trial)."""
        for path, source in list(self.sources.items()):
            if keep is None or path != keep.path:
                shutil.rmtree(source.parent, ignore_errors=True)
                del self.sources[path]

    def _calibrating(self, number: int) -> Callable[[int, int], None]:
        def report(done: int, total: int) -> None:
            if done == total or done % max(1, total // 4) == 0:
                self.say(f"[{number}] calibrating {done}/{total} samples")

        return report


def _speed(trial: Trial) -> str:
    latency = trial.latency or {}
    p50s = [(key.removeprefix("p50_ms_b"), ms) for key, ms in latency.items() if key.startswith("p50_ms_b")]
    return ", ".join(f"p50 {ms:.3g} ms at batch {batch}" for batch, ms in p50s)
