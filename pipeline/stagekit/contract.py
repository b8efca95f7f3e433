"""What every stage is to `pipe run` and to its own command: see the package doc.

A stage's `stage.py` ends with its `STAGE`:

    STAGE = Stage("optimize", fresh=_fresh, run=_run)

`run(ctx)` calls the same entry function the stage's command calls, with `ctx.progress`; `fresh(ctx)` says
why the stage's output is up to date (or None to run it); `off(ctx)` why it does not apply at all. The chain
(pipeline/chain/chain.py) is a list of stage package names, so adding a stage is one package and one line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.recipe.schema import Recipe

Progress = Callable[[str], None]  # one line of progress for a person; every stage entry takes it as `progress`
Overrides = Mapping[str, Any]  # command-line values keyed like the stage's recipe section, validated by its schema


@dataclass
class Context:
    """What the stages of one `pipe run` share: the recipe, where artifacts go, and the version worked on."""

    recipe: Recipe
    recipe_path: Path
    out_root: Path
    progress: Progress
    root: Path | None = None  # the artifact version; set by train (ran or found up to date)

    @property
    def version(self) -> Path:
        """The version the stages after train work on; train sets it before any of them runs."""
        if self.root is None:
            raise RuntimeError("the train stage sets the version before any later stage runs")
        return self.root


def applies(ctx: Context) -> str | None:
    """`off` for a stage that always applies."""
    return None


# the stages that have no form for a language model yet (task text-generation): none now (docs/language-models.md).
# optimize makes weight-only int8/int4 judged on text; check compares perplexity and greedy agreement
NOT_YET_FOR_LMS: tuple[str, ...] = ()
# edge is not "not yet" but measured (docs/language-models.md, "Edge"): onnx2tf cannot convert the graph at all
LM_EDGE_REFUSAL = (
    "onnx2tf 1.28.8 cannot convert a decoder's KV-cache graph: measured on a 2-layer Llama, all 5 onnx2tf "
    "settings pipe tries stop at the causal mask's Range node ('node_arange': its limit is a rank-1 tensor where "
    "TensorFlow's tf.range takes a scalar), even with the past fixed at 0 and the prompt at one length; and a "
    "TFLite file is capped at 2 GB, so a decoder past it cannot be one .tflite. Serve it with pipe serve "
    "(onnxruntime, which runs the int8/int4 variants too)"
)


def lm_refusal(stage: str, task: str, where: object) -> str | None:
    """Why `stage` cannot take a model of `task` (None when it can): one sentence naming what exists instead."""
    if task == "text-generation" and stage == "edge":
        return f"pipe {stage} does not convert a language model ({where} has task text-generation): {LM_EDGE_REFUSAL}"
    if task != "text-generation" or stage not in NOT_YET_FOR_LMS:
        return None
    return (
        f"pipe {stage} does not take a language model yet ({where} has task text-generation); what a decoder "
        "has today is import, train, export with its KV-cache gate, and greedy generation (docs/language-models.md)"
    )


def lm_off(stage: str) -> Callable[[Context], str | None]:
    """`off` for edge or a stage in NOT_YET_FOR_LMS: `pipe run` of an LM recipe passes over it, saying why."""

    def off(ctx: Context) -> str | None:
        return lm_refusal(stage, ctx.recipe.task, ctx.recipe_path)

    return off


@dataclass(frozen=True)
class Stage:
    """A stage as `pipe run` walks it (see the module doc)."""

    name: str
    fresh: Callable[[Context], str | None]  # why the stage's output is up to date, or None to run it
    run: Callable[[Context], str]  # do the work through the stage's entry function; returns what it made
    off: Callable[[Context], str | None] = applies  # why it does not apply (even with --force)
    judges: bool = False  # a CheckFailed here is recorded and the later stages still run
