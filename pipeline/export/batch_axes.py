"""The import's batch axes: which axis of each tensor holds the samples, and the outputs' computed shapes.

Inputs: `--batch-axis NAME:AXIS` declares one (Silero VAD's `state:1`); without it a dim named as a
batch (`batch`, `batch_size`, `N`, any case) at an axis other than 0 is taken, and said. The batch
dims of all inputs are then one dim: named `batch` when the graph left them free, else the name the
graph gives (so generated inputs, the gate and Triton vary them together).

Outputs: the model is run at one sample, two samples, and (when an input has another free dim) at
half that size. The axis of size 1 at one sample and 2 at two is the output's batch axis (the first
axis when it is one of them); with a fixed
batch (which cannot vary) it is `--batch-axis`, else the first axis of the batch's size. An output
whose computed shape contradicts the declared one (another rank, another fixed size: ddddocr's
recognizer declares [1, seqlen] and computes [T, 1, 8210]) is taken as computed: axes that follow a
free input dim are free, the batch axis is the batch, the rest are the sizes seen. Every such
decision is a note in the import record and output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from pipeline.artifact.dims import FREE
from pipeline.artifact.tensors import TensorSpec
from pipeline.core.arrays import Arrays
from pipeline.core.errors import InputError
from pipeline.export.shapes import free_name

BATCH_NAMES = ("batch", "batch_size", "n")  # dim names read as a batch axis, compared in lower case
BATCH = "batch"  # the name batch dims left free by the graph get


def parse_batch_axes(given: list[str] | tuple[str, ...]) -> dict[str, int]:
    """`--batch-axis NAME:AXIS` (repeatable) -> {NAME: AXIS}; the name is what precedes the last colon."""
    axes: dict[str, int] = {}
    for item in given:
        name, sep, axis = item.rpartition(":")
        if not sep or not name or not axis.strip().isdigit():
            raise InputError(f"--batch-axis {item!r}: expected NAME:AXIS with AXIS a whole number, e.g. state:1")
        if name in axes:
            raise InputError(f"--batch-axis gives tensor {name!r} twice; give each tensor once")
        axes[name] = int(axis)
    return axes


def declare_input_axes(
    inputs: list[TensorSpec], outputs: list[TensorSpec], given: dict[str, int], notes: list[str]
) -> None:
    """Set `batch_axis` on the inputs (given, or read from a dim's name) and make their batch dims one."""
    known = {s.name for s in [*inputs, *outputs]}
    if unknown := sorted(set(given) - known):
        raise InputError(f"--batch-axis names {unknown}, which the model does not have; its tensors are "
                         f"{sorted(known)}")  # fmt: skip
    for spec in inputs:
        axis = given.get(spec.name)
        if axis is None:
            named = [i for i, d in enumerate(spec.shape) if isinstance(d, str) and d.lower() in BATCH_NAMES]
            if not named or named[0] == 0 or (isinstance(spec.shape[0], str) and spec.shape[0].lower() in BATCH_NAMES):
                continue
            axis = named[0]
            notes.append(f"input {spec.name!r}: batch axis {axis}, read from its dim name {spec.shape[axis]!r}")
        if axis >= len(spec.shape):
            raise InputError(f"--batch-axis {spec.name}:{axis}: {spec.name!r} has {len(spec.shape)} dims {spec.shape}")
        spec.batch_axis = axis or None
    _one_batch_dim(inputs, outputs)


def _one_batch_dim(inputs: list[TensorSpec], outputs: list[TensorSpec]) -> None:
    """The inputs' symbolic batch dims renamed to one name, wherever they appear (outputs included)."""
    dims = [s.shape[s.sample_axis] for s in inputs if s.shape and isinstance(s.shape[s.sample_axis], str)]
    if len(set(dims)) < 2 and not any(s.batch_axis for s in inputs):
        return
    real = [d for d in dims if not _is_free(d, inputs)]
    name = real[0] if real else BATCH
    renamed = {d: name for d in dims}
    for spec in [*inputs, *outputs]:
        spec.shape = [renamed.get(d, d) if isinstance(d, str) else d for d in spec.shape]


def _is_free(dim: str, inputs: list[TensorSpec]) -> bool:
    return any(dim == free_name(s.name, axis) for s in inputs for axis in range(len(s.shape)))


Run = Callable[[Arrays], Arrays]  # the model in its own layout for outputs, sample-leading inputs


def computed_outputs(
    run: Run, samples: Arrays, inputs: list[TensorSpec], outputs: list[TensorSpec], given: dict[str, int],
    notes: list[str],
) -> list[TensorSpec]:  # fmt: skip
    """The outputs with their batch axes, and taken as computed where the graph declares otherwise."""
    count = len(next(iter(samples.values())))
    batch = next((s.shape[s.sample_axis] for s in inputs if s.shape), BATCH)
    first = batch if isinstance(batch, int) else 1  # a fixed batch runs that many samples, no other count
    one = run({k: v[:first] for k, v in samples.items()})
    two = run({k: v[np.arange(2) % count] for k, v in samples.items()}) if first == 1 and batch != 1 else None
    half = _halved(run, {k: v[:first] for k, v in samples.items()}, inputs)
    taken = []
    for spec in outputs:
        got = np.asarray(one[spec.name]).shape
        # the axis as long as the samples: 1 at one sample, 2 at two (an axis that merely grows is not it)
        seen = np.asarray(two[spec.name]).shape if two else ()
        follows = [i for i, n in enumerate(seen) if (got[i], n) == (1, 2)] if len(seen) == len(got) else []
        varies = [i for i, n in enumerate(np.asarray(half[spec.name]).shape) if n != got[i]] if half else []
        axis = given.get(spec.name)
        if axis is None:
            axis = (0 if 0 in follows else follows[0]) if follows else _fixed_axis(spec, got, batch, varies)
        declared = spec.shape
        contradicts = len(declared) != len(got) or any(
            isinstance(d, int) and d != n for d, n in zip(declared, got, strict=True)
        )
        if contradicts:
            shape: list[int | str] = [
                batch if i == axis else free_name(spec.name, i) if i in varies else n for i, n in enumerate(got)
            ]
            notes.append(f"output {spec.name!r} is declared {declared} but computes {list(got)}: taken as computed, "
                         f"{shape}")  # fmt: skip
            spec = replace(spec, shape=shape)
        elif axis and axis < len(spec.shape) and isinstance(spec.shape[axis], str):  # a batch on another axis
            spec = replace(spec, shape=[batch if i == axis else d for i, d in enumerate(spec.shape)])
        if axis is not None and axis >= len(spec.shape):
            raise InputError(f"--batch-axis {spec.name}:{axis}: output {spec.name!r} computes {len(got)} dims "
                             f"{list(got)}")  # fmt: skip
        if axis:
            how = (
                "given"
                if spec.name in given
                else "the axis that follows the samples"
                if follows
                else f"the first axis of the fixed batch's size {batch}; --batch-axis {spec.name}:AXIS gives another"
            )
            notes.append(f"output {spec.name!r}: batch axis {axis} ({how})")
        taken.append(replace(spec, batch_axis=axis or None))
    return taken


def _fixed_axis(spec: TensorSpec, got: tuple[int, ...], batch: int | str, varies: list[int]) -> int | None:
    """A fixed batch's axis in an output: the declared first axis when it has the batch's size, else the
    first axis of that size that no other dim moves."""
    if not isinstance(batch, int):
        return None
    if got and got[0] == batch:
        return 0
    return next((i for i, n in enumerate(got) if n == batch and i not in varies), None)


def _halved(run: Run, samples: Arrays, inputs: list[TensorSpec]) -> Arrays | None:
    """The model on `samples` with every other symbolic dim of its inputs halved; None when there are
    none, or it does not run there (the outputs' other axes are then taken as fixed)."""
    one = dict(samples)
    cut = False
    for spec in inputs:
        for axis, dim in enumerate(spec.shape):
            if axis == spec.sample_axis or not isinstance(dim, str) or dim == FREE:
                continue
            view = axis + 1 if axis < spec.sample_axis else axis  # the axis in pipe's sample-leading array
            length = one[spec.name].shape[view]
            if length > 1:
                one[spec.name] = np.take(one[spec.name], np.arange(length // 2), axis=view)
                cut = True
    if not cut:
        return None
    try:
        return run(one)
    except Exception:  # onnxruntime's errors share no base; a size the model refuses says nothing here
        return None
