"""A variant kind: one transformation of model.onnx into one variant, with its settings beside it.

Modelled on Olive's passes (one class per transformation, its config type beside it, a default
config and a run hook). A kind is one module holding one subclass of `Kind`:

- `name`, `precision`: the variant it makes (`int8-static` -> variants/model.int8-static.onnx, int8);
- `serves(task)`: whether it is made for models of this task (a decoder's kinds are weight-only;
  the others are for every other task);
- `asked(spec)`: whether the optimize section asks for it (by default `choice` in `--quantize`);
- `calibrates(spec, real)`: whether it needs real samples to calibrate on (`Job.calibration`);
- `parent`: the variant it is made from, when not model.onnx (made earlier in the same run, and
  passed; else this kind is not made, and a note says why); it is still judged against model.onnx;
- `config(spec, task)`: its own settings type, made from the section (defaults are declared once,
  in the recipe's `OptimizeSpec`; a kind keeps only what it uses);
- `skip(source, config)`: why it does not apply to this graph ('' when it does: a note, no failure);
- `make(job, config)`: write `job.dst`, judge it, and say what it did (a `Made`).

`kinds.py` lists the kinds, one line each; the stage loops over that list, and one kind failing is
that variant's failed record, never the end of the run (stage.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from pipeline.artifact.variants import variant_file
from pipeline.optimize.judge import Judge, Verdict
from pipeline.recipe.schema import OptimizeSpec
from pipeline.samples.calibration import Calibration

Config = TypeVar("Config")
Say = Callable[[str], None]


@dataclass
class Job:
    """What a kind is given to make its variant."""

    source: Path  # what the kind is made from: model.onnx, or its parent variant's file; never modified
    dst: Path  # where the variant goes: the scratch directory's variants/model.<name>.onnx
    scratch: Path  # the stage's scratch directory (a kind makes its own sub-directory for intermediates)
    judge: Judge  # holds a file against model.onnx: lossy budget by default, `judge.lossless` for fp32 kinds
    calibration: Calibration | None  # real samples, when a kind asked for the run calibrates
    say: Say  # one line for a person, prefixed by the kind


@dataclass
class Made:
    """One variant built in the scratch directory and judged (or not made at all: `written` False)."""

    name: str
    precision: str
    settings: dict[str, Any]
    verdict: Verdict
    details: dict[str, Any]  # what the transformation reports (graph passes, quantized nodes, the search)
    latency: dict[str, float] = field(default_factory=dict)
    size: int | None = None  # bytes, once written
    note: str = ""  # what a reader must know beyond pass/fail (an int8 model smaller but not faster, and why)
    written: bool = True  # False: the kind failed before it had a file; recorded as failed, with why
    parent: str | None = None  # sha256 of the file it was made from when not model.onnx (a parent variant's)

    @property
    def file(self) -> str:
        return variant_file(self.name)


class Kind(ABC, Generic[Config]):
    """One variant kind; see the module doc. Subclasses set the class attributes and the two hooks."""

    name: ClassVar[str]  # the variant name (a file name part: lowercase, digits, '-' and '_')
    precision: ClassVar[str]  # fp32 | fp16 | int8 | int4 ...
    choice: ClassVar[str | None] = None  # the `--quantize` value that asks for it; None: asked otherwise
    parent: ClassVar[str | None] = None  # the variant it is made from; None: model.onnx

    def serves(self, task: str) -> bool:
        """Whether this kind is made for a model of `task`: by default every task but text-generation (a decoder
        gets the weight-only kinds: activations quantized at run time lost half its next tokens, issue 29)."""
        return task != "text-generation"

    def asked(self, spec: OptimizeSpec) -> bool:
        """Whether the optimize section asks for this variant."""
        return self.choice is not None and self.choice in spec.quantize

    def calibrates(self, spec: OptimizeSpec, real_samples: bool) -> bool:
        """Whether the run must read calibration samples for this kind (`real_samples`: the artifact has them)."""
        return False

    @abstractmethod
    def config(self, spec: OptimizeSpec, task: str) -> Config:
        """This kind's settings, from the optimize section (command-line values on top) and the model's task."""

    def skip(self, source: Path, config: Config) -> str:
        """Why this kind is not made for the graph at `source` ('' when it is): said as a note, not a failure."""
        return ""

    @abstractmethod
    def make(self, job: Job, config: Config) -> Made:
        """Write the variant to `job.dst`, judge it with `job.judge`, and say what was done."""
