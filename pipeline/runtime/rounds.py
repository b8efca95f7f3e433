"""Side-by-side timing: models measured in rounds, each round running every unfinished model once.

A fixed rotation put each model behind the same neighbour in (n-1)/n of rounds, a systematic bias on a
machine whose caches and clocks one model leaves to the next; each round's order is drawn at random from
one seed instead, so it is the same on every run. Garbage collection is off while timing. Latency
(`latency.py`, one `session.run` a sample) and decoder speed (`lm_speed.py`, one greedy generation a sample)
both time through `interleaved`, and both check their settings with `timing_problems`.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence

import numpy as np

ORDER_SEED = 0  # the rounds' random orders: the same on every run


def interleaved(
    names: Sequence[str], run: Callable[[str], Sequence[int]], seconds: float, min_runs: int, max_runs: int
) -> dict[str, list[Sequence[int]]]:
    """Each model's runs, in rounds, until every model has `max_runs`, or `min_runs` and `seconds` of its own
    time. `run(name)` runs the model once and gives the nanoseconds it took (one figure, or one a step); their
    sum is charged to its time. Every model below `max_runs` runs each round, even one past its time, so the
    slow models' samples keep sharing their window with the fast ones'."""
    runs: dict[str, list[Sequence[int]]] = {name: [] for name in names}
    total = dict.fromkeys(names, 0)
    budget = int(seconds * 1e9)

    def finished(name: str) -> bool:
        count = len(runs[name])
        return count >= max_runs or (count >= min_runs and total[name] >= budget)

    order = np.random.default_rng(ORDER_SEED)
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        while not all(finished(name) for name in names):
            for index in order.permutation(len(names)):
                name = names[index]
                if len(runs[name]) >= max_runs:
                    continue
                timed = run(name)
                runs[name].append(timed)
                total[name] += sum(timed)
    finally:
        if was_enabled:
            gc.enable()
    return runs


def timing_problems(threads: int, seconds: float, warmup: int, min_runs: int, max_runs: int) -> list[str]:
    """What is wrong with the settings of a side-by-side timing, each with its fix (empty: nothing), so
    latency.py and lm_speed.py refuse the same values in the same words, every problem at once.

    `seconds` must be positive, as `pipe benchmark --seconds` and `pipe check --latency-seconds` say:
    a fixed number of runs is `min_runs == max_runs`, whatever the seconds."""
    problems = []
    if threads < 1:
        problems.append(f"threads is {threads}; give 1 or more (0 would let the timing depend on the machine)")
    if not seconds > 0:
        problems.append(f"seconds is {seconds}; give a positive duration")
    if warmup < 0:
        problems.append(f"warmup is {warmup}; give 0 or more runs")
    if not 1 <= min_runs <= max_runs:
        problems.append(f"min_runs {min_runs} and max_runs {max_runs} need 1 <= min_runs <= max_runs")
    return problems
