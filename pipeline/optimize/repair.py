"""When no candidate meets the budget: leave the node adding the most error in fp32, quantize again, repeat.

The nodes of the closest trial are ranked by the error each adds (sensitivity.py: fp32 and quantized
activations compared node by node), the worst is left in fp32, the model is quantized again with
the closest settings (and the closest settings of each other kind of int8) and judged, and the
ranking is redone on the new model, until the budget holds, `limit` nodes are out, no node left
adds error, quantization fails or the search's time is up. Each exclusion is recorded with the
error that condemned it, for the report.

Repair asks the search for a few things only (`Retries`: say and note, attempt settings, prune,
the fp32 graph a trial was made from, a node's name in the source), so it holds no half of the
search's class and imports nothing above it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from pipeline.optimize.nodes import quantizable_nodes
from pipeline.optimize.quantize import QuantSettings
from pipeline.optimize.sensitivity import NodeScore, sensitivity
from pipeline.optimize.trial import Trial, finite

SENSITIVITY_SAMPLES = 64  # real samples compared node by node: enough to rank nodes, cheap on a big model


@dataclass(frozen=True)
class Exclusion:
    """A node the search left in fp32, and the error that condemned it."""

    node: str
    op_type: str
    score: float  # the relative error it added in the model it was ranked on
    why: str  # one line: the error at its output against the error at its inputs, and which trial

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "op_type": self.op_type, "score": finite(self.score), "why": self.why}


class Retries(Protocol):
    """What repair asks of the search (search.Search is one)."""

    scratch: Path  # where node-by-node comparisons write their files

    def say(self, message: str) -> None:
        """One line of progress."""

    def note(self, message: str) -> None:
        """Record why the search went or stopped where it did (the report's notes), and say it."""

    def attempt(self, settings: QuantSettings, excluded: tuple[str, ...] = ()) -> Trial:
        """Quantize with `settings` and judge; `excluded`: the nodes repair left in fp32 so far."""

    def prune(self, keep: Trial | None = None) -> None:
        """Drop the intermediate graphs no later step reads, all but `keep`'s."""

    def graph_of(self, trial: Trial) -> Path:
        """The fp32 graph quantize made `trial` from (pre-processed: nodes may be fused and renamed)."""

    def name_in_source(self, node: str) -> str | None:
        """`node`'s name in the source model, or None when it has none there."""


def repair(
    search: Retries,
    start: Trial,
    samples: Mapping[str, np.ndarray],
    limit: int,
    threads: int,
    others: Sequence[QuantSettings] = (),
    out_of_time: Callable[[], bool] = lambda: False,
) -> list[Exclusion]:
    """Leave the worst node of `start` in fp32, re-quantize, judge; repeat until within budget or `limit`.

    Each exclusion is also tried with the `others` settings (the next closest candidates): the
    closest trial of the step, by margin, is the one ranked for the next exclusion. Returns the
    nodes left in fp32, each with the error that condemned it.
    """
    search.say(f"no candidate met the budget; repairing the closest, {start.name} ({start.verdict.detail})")
    search.prune(keep=start)
    inputs = {k: v[:SENSITIVITY_SAMPLES] for k, v in samples.items()}
    current, excluded = start, start.excluded
    exclusions: list[Exclusion] = []
    while not current.verdict.passed:
        if out_of_time():
            search.note(f"repair stopped after {len(excluded)} exclusion(s): the search's time is up")
            break
        if len(excluded) >= limit:
            search.note(f"stopped after {len(excluded)} exclusion(s): max_exclusions is {limit}")
            break
        worst = _worst(search, current, inputs, {*excluded, *start.settings.nodes_to_exclude}, threads)
        if worst is None:
            break
        node, score = worst
        search.say(f"excluding {node} ({score.op_type}, adds relative error {score.score:.3g})")
        where = f" (as {score.node} after pre-processing)" if score.node != node else ""
        exclusions.append(Exclusion(node, score.op_type, score.score, f"{score.why()} in {current.name}{where}"))
        excluded = (*excluded, node)
        step = []
        for base in (start.settings, *others):
            settings = replace(base, nodes_to_exclude=(*base.nodes_to_exclude, *excluded))
            step.append(search.attempt(settings, excluded))
            if step[-1].verdict.passed:
                break
        made = [t for t in step if t.size]
        if not made:  # quantization itself failed: nothing left to rank
            search.note(f"stopped: {step[0].verdict.detail}")
            break
        current = max(made, key=lambda t: (t.verdict.passed, t.verdict.margin, t.settings.per_channel))
        search.prune(keep=current)
    return exclusions


def _worst(
    search: Retries, trial: Trial, inputs: Mapping[str, np.ndarray], skip: set[str], threads: int
) -> tuple[str, NodeScore] | None:
    """The node of `trial` adding the most error, by its name in `src`; None (and a note) when none helps.

    Pre-processing fuses nodes (`fc/MatMul` + `fc/Add` -> `fc/MatMul/MatMulAddFusion`), so nodes are
    ranked in the graph quantize worked on and named back as they are in `src`.
    """
    source = search.graph_of(trial)
    search.say(f"ranking the nodes of {trial.name} by the error each adds")
    candidates = set(quantizable_nodes(source, "static")) | set(quantizable_nodes(source, trial.settings.mode))
    ranked = sensitivity(source, trial.path, inputs, search.scratch, nodes=candidates, threads=threads)
    named = [(name, score) for score in ranked if (name := search.name_in_source(score.node)) and name not in skip]
    if not named:
        search.note(f"stopped: no node of {trial.name} left to exclude could be compared with fp32")
    elif not named[0][1].score > 0:
        worst = named[0][1].score
        search.note(
            f"stopped: no node of {trial.name} adds error (the worst adds {worst:.3g}); leaving more in fp32 "
            "cannot help"
        )
    else:
        return named[0]
    return None
