"""`int8` (`--quantize auto`): the fastest int8 model within the budget, found by the search (search.py).

The plan (plan.py) picks the candidate families from what the graph holds; the search quantizes them
with the same kinds `--quantize dynamic` and `static` use (quantizers.py), times them beside fp32,
repairs the closest when none passes; the kept file is judged once more with the full table.
Static candidates are tried only when the artifact has real samples to calibrate on.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from pipeline.optimize.kind import Job, Kind, Made
from pipeline.optimize.nodes import already_int8
from pipeline.optimize.plan import plan_for
from pipeline.optimize.search import auto_search
from pipeline.recipe.schema import OptimizeSpec
from pipeline.runtime.external_data import move_model


@dataclass(frozen=True)
class SearchSettings:
    """How far the search goes."""

    max_exclusions: int  # nodes it may leave in fp32
    seconds: float  # no new candidate is started after this many seconds (the first always is)
    threads: int  # intra-op threads candidates are timed with
    task: str  # the model's task: a detector's static candidates keep the decode tail in fp32


class AutoInt8(Kind[SearchSettings]):
    name, precision, choice = "int8", "int8", "auto"

    def calibrates(self, spec: OptimizeSpec, real_samples: bool) -> bool:
        return real_samples  # without real samples the search tries dynamic candidates only

    def config(self, spec: OptimizeSpec, task: str) -> SearchSettings:
        return SearchSettings(spec.max_exclusions, spec.search_seconds, spec.threads, task)

    def skip(self, source: Path, config: SearchSettings) -> str:
        return already_int8(source, self.name)

    def make(self, job: Job, config: SearchSettings) -> Made:
        if job.calibration is None:
            job.say("auto: no real inputs to calibrate on (imported without --eval-data): dynamic only")
        plan = plan_for(job.source, job.calibration is not None, config.task)
        holds = ", ".join(f"{kind} {size / 2**20:.2f} MB" for kind, size in plan.weights.items() if size)
        job.say(f"auto: the graph's weights: {holds or 'none'}; families: {', '.join(f.name for f in plan.families)}")
        for note in plan.notes:
            job.say(f"auto: {note}")
        workdir = job.scratch / "search"
        workdir.mkdir()
        result = auto_search(
            job.source,
            workdir,
            plan.families,
            job.calibration.inputs if job.calibration else None,
            lambda path: job.judge(path, None, workdir),
            job.judge.evaluation.samples,
            max_exclusions=config.max_exclusions,
            threads=config.threads,
            progress=lambda message: job.say(f"auto: {message}"),
            budget=config.seconds,
        )
        move_model(result.chosen.path, job.dst)  # with its external data, if it has any
        shutil.rmtree(workdir, ignore_errors=True)  # every other trial's file: the kept one is moved out
        verdict = job.judge(job.dst, None, job.scratch)  # the kept file itself, judged once more with the full table
        job.say(f"int8 (auto): {result.chosen.settings.describe()}: {'passed' if verdict.passed else 'FAILED'}: "
                f"{verdict.detail}")  # fmt: skip
        details = {"plan": plan.to_dict(), "search": result.to_dict()}
        note = result.why_not_faster if verdict.passed else ""
        return Made(self.name, self.precision, result.chosen.settings.to_dict(), verdict, details, note=note)


INT8_AUTO = AutoInt8()
