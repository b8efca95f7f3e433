"""Which tasks an imported model's outputs fit, the task it takes when none is given, and its labels' fit.

What each task asks of the outputs (the first output is the task's; shapes as the graph declares
them, after `--input-shape`):

- classification: [batch, classes], or [batch, positions, classes] with a free positions axis (one
  prediction per position: a CTC text recognizer, a token tagger) and a fixed class count; a class
  count is at least 2 (an argmax over one value says nothing). A [batch] integer output (class ids)
  fits too.
- detection: exactly one output, [batch, 4 + classes, anchors] (the Ultralytics head exported
  without NMS), with at least one class.
- text-recognition: a CTC recognizer, [batch, positions, classes] with a fixed class count (its
  dictionary and convention: pipeline/export/recognizer.py).
- regression, embedding, tensor: any outputs.

A task given with `--task` that does not fit is refused with the reason. Without `--task`, the
task the metadata names (Ultralytics' `task`) is taken when it fits; otherwise the default,
classification, when the outputs fit a classifier; otherwise `tensor`, with a note saying why:
a model whose outputs cannot be a classifier's never silently becomes one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.artifact.tensors import TensorSpec
from pipeline.core.arrays import Arrays
from pipeline.core.errors import InputError

DEFAULT_TASK = "classification"
TEXT = "text-recognition"
CHOICES = (
    "tasks are classification (one [batch, classes] output), regression, embedding, detection (one "
    "[batch, 4 + classes, anchors] output), text-recognition (a CTC recognizer's [batch, positions, classes] "
    "output) and tensor (any outputs, each judged as a tensor)"
)
LABELLED = ("classification", "detection")  # the tasks whose outputs hold classes that labels name


def fit_problem(task: str, outputs: list[TensorSpec]) -> str | None:
    """Why the model's outputs do not fit `task`, or None when they do (see the module doc)."""
    first = outputs[0]
    shape, where = first.shape, f"output {first.name!r} {_shape(first.shape)}"
    if task == "text-generation":
        return (
            "a causal LM imports from its transformers directory (pipe import DIR), where its cache layout, "
            "EOS ids and tokenizer are read (docs/language-models.md); an ONNX file alone imports as tensor"
        )
    if task == "classification":
        if len(shape) == 1 and first.dtype.startswith(("int", "uint")):
            return None  # class ids
        classes = shape[-1] if len(shape) in (2, 3) else None
        if len(shape) == 3 and (isinstance(shape[1], int) or not isinstance(classes, int)):
            return (
                f"{where} is not a classifier's: a classifier has one [batch, classes] output, or [batch, positions, "
                "classes] with a free positions axis and a fixed class count"
            )
        if len(shape) not in (2, 3):
            return f"{where} is not a classifier's: a classifier has one [batch, classes] output"
        if isinstance(classes, int) and classes < 2:
            return f"{where} holds {classes} class: a classifier's argmax needs at least 2 (a score is regression)"
        return None
    if task == TEXT and (len(shape) != 3 or not isinstance(shape[2], int) or shape[2] < 2):
        return f"{where} is not a CTC recognizer's [batch, positions, classes] with a fixed class count (at least 2)"
    if task == "detection":
        if len(outputs) != 1:
            return (
                f"detection needs one output [batch, 4 + classes, anchors] (the Ultralytics head exported without "
                f"NMS); the model has {len(outputs)}: {', '.join(o.name for o in outputs)}"
            )
        if len(shape) != 3 or (isinstance(shape[1], int) and shape[1] < 5):
            return f"{where} is not a detection head's [batch, 4 + classes, anchors] with at least one class"
    return None


@dataclass(frozen=True)
class Choice:
    """A task chosen, where it came from, and any note to show (why the metadata's or the default was not taken)."""

    task: str
    source: str
    notes: tuple[str, ...] = ()


def choose_task(given: str | None, from_metadata: tuple[str, str] | None, outputs: list[TensorSpec]) -> Choice:
    """The task an import takes: `--task` (refused when it does not fit), else the metadata's, else the default.

    `from_metadata`: (task, source) read from the exporter's metadata, or None.
    """
    if given is not None:
        if problem := fit_problem(given, outputs):
            raise InputError(f"--task {given}: {problem}; the {CHOICES}")
        return Choice(given, "--task")
    if from_metadata is not None:
        task, source = from_metadata
        problem = fit_problem(task, outputs)
        if problem is None:
            return Choice(task, source)
        why = f"{source} says {task}, but {problem}"
    else:
        problem = fit_problem(DEFAULT_TASK, outputs)
        if problem is None:
            return Choice(DEFAULT_TASK, "default")
        why = problem
    note = (
        f"task tensor: {why}; each output is judged as a tensor. Pass --task to say what the model is (the {CHOICES})"
    )
    return Choice("tensor", "default: the outputs fit no task named", (note,))


def classes_of(task: str, outputs: list[TensorSpec], golden: Arrays) -> int | None:
    """How many classes the task's output holds, as the model ran; None for a task without classes."""
    if task not in LABELLED:
        return None
    output: np.ndarray = golden[outputs[0].name]
    if task == "detection":
        return int(output.shape[1]) - 4 if output.ndim == 3 else None
    return int(output.shape[-1]) if output.ndim >= 2 else None


def labels_problem(task: str, labels: list[str], outputs: list[TensorSpec], golden: Arrays) -> str | None:
    """Why `labels` do not name the classes the model's output holds, or None when they do."""
    if not labels or task not in LABELLED:
        return None
    first, output = outputs[0], golden[outputs[0].name]
    if task == "detection" and (output.ndim != 3 or output.shape[1] < 5):
        return f"output {first.name!r} gives {list(output.shape)}, not [batch, 4 + classes, anchors]"
    if task == "classification":
        if output.ndim < 2:
            return f"output {first.name!r} has shape {list(output.shape)}, not [batch, classes]"
        declared = first.shape[-1]
        if isinstance(declared, int) and declared != output.shape[-1]:
            return f"output {first.name!r} declares {declared} classes but gives {output.shape[-1]}; fix the graph"
    classes = classes_of(task, outputs, golden)
    if len(labels) != classes:
        shown = labels if len(labels) <= 10 else [*labels[:10], "..."]
        return f"{len(labels)} labels given ({shown}) but output {first.name!r} has {classes} classes"
    return None


def _shape(shape: list[int | str]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"
