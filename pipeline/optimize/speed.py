"""How the auto search times its candidates: a few at a time beside fp32, each then faster, on par or slower.

Timing every candidate at the end, each in a session of its own, held every session of the search
in memory at once (28 of them on a real conv net: 11.6 GB) and gave the family that is slower no
chance to stop early. Here a group is fp32 and at most GROUP candidates, timed side by side in one
run (pipeline/runtime/latency.py), its sessions freed before the next group: a candidate's speed is
its ratio to the fp32 timed beside it, which holds across groups when the absolute milliseconds
drift with the machine's load. Batch 32 is timed only where it is cheap (`affordable_batches`).

What is kept follows from the ratios at batch 1 (or the batch a fixed-batch model takes): the
fastest passed candidate that is faster than fp32 beyond NOISE; when none is, the smallest passed
one (int8 still makes it smaller), and the report says plainly that it is not faster.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.optimize.trial import Trial
from pipeline.runtime.latency import affordable_batches, measure

GROUP = 2  # candidates per timing run beside fp32: at most 3 sessions resident while timing
SPEED_BATCHES = (1, 32)  # batch 1 decides; 32 breaks ties where it is cheap to time


class Timer:
    """Times trials beside fp32 in groups of GROUP, at the batches affordable for `src`."""

    def __init__(
        self,
        src: Path,
        samples: Mapping[str, np.ndarray],
        threads: int,
        seconds: float,
        say: Callable[[str], None],
    ) -> None:
        self.src, self.samples, self.threads, self.seconds, self.say = src, dict(samples), threads, seconds, say
        self.batches = affordable_batches(src, self.samples, SPEED_BATCHES, threads)
        self.groups = 0  # timing runs made, for the report

    def time(self, trials: Sequence[Trial]) -> None:
        """Set each trial's latency, its fp32 neighbour's and its speedups, GROUP trials per run."""
        for start in range(0, len(trials), GROUP):
            group = list(trials[start : start + GROUP])
            self.groups += 1
            names = ", ".join(t.name for t in group)
            self.say(f"timing {names} beside fp32 (batch {', '.join(map(str, self.batches))}; {self.threads} thread)")
            models = {"fp32": self.src, **{f"candidate{i}": t.path for i, t in enumerate(group)}}
            results = measure(models, self.samples, batches=self.batches, threads=self.threads, seconds=self.seconds)
            fp32 = results["fp32"]
            for i, trial in enumerate(group):
                mine = results[f"candidate{i}"]
                trial.latency, trial.fp32_latency = mine.to_dict(), fp32.to_dict()
                trial.speedup = {b: fp32.batches[b].p50_ms / mine.batches[b].p50_ms for b in sorted(mine.batches)
                                 if b in fp32.batches}  # fmt: skip
                self.say(f"{trial.name}: {trial.speed} ({_ratios(trial.speedup)} fp32's speed)")


@dataclass
class Choice:
    """What the search keeps and how it compares with fp32's speed."""

    trial: Trial | None  # None: nothing passed
    speed: str  # faster | not faster (on par or slower) | none passed


def choose(tried: Sequence[Trial]) -> Choice:
    """The fastest passed trial faster than fp32; else the smallest passed one; else none."""
    passing = [t for t in tried if t.verdict.passed]
    faster = [t for t in passing if t.speed == "faster"]
    if faster:
        return Choice(max(faster, key=lambda t: tuple(t.speedup[b] for b in sorted(t.speedup))), "faster")
    if passing:  # smaller is all int8 gave here; of those, one slower beyond noise only when nothing else passed
        return Choice(min(passing, key=lambda t: (t.speed == "slower", t.size)), "not faster")
    return Choice(None, "none passed")


def _ratios(speedup: dict[int, float]) -> str:
    return ", ".join(f"{ratio:.2f}x at batch {batch}" for batch, ratio in speedup.items()) or "-"
