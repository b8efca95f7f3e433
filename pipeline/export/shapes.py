"""The dims of an imported graph: free dims named, `--input-shape` applied, sizes for generated inputs.

Exporters spell "any size" several ways: a `dim_param` name (`batch`, `N`), a placeholder that
unrelated axes share (paddle2onnx writes `?` for both height and width), `dim_value: -1`
(paddle2onnx's batch), or a dim with neither value nor name. A real name is kept, and axes that
share it are equal, as ONNX defines. Every other spelling is a free dim of its own, named
`<tensor>_dim<axis>`: two `?` axes are never taken to be equal.

`--input-shape NAME:d0,d1,...` then fixes dims (an int), names them (a name; axes given one name
are equal), or leaves them as declared (`?` or `-1`). The change applies wherever the dim's name
appears, outputs included, and is written into the imported graph so that onnxruntime, pipe serve
and Triton all hold the model to it.

Without evaluation data the import generates inputs: a batch (leading) axis gets 16 samples; any
other symbolic dim gets the first size of a short ladder at which the model runs, both at that
size and at half of it (the gate's second length). A spatial axis of an image input starts from
the model's own hint: the size its exporter recorded (Ultralytics' `imgsz`), else the size of
`--image-preprocessing`, else the other spatial axis when that one is fixed, else 32; any other
axis (a sequence) starts from 4. The ladder doubles from there, so a convolution that needs a
minimum size is run at one it takes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx

from pipeline.artifact.dims import FREE, is_dim_name
from pipeline.artifact.preprocessing import image_record
from pipeline.artifact.tensors import TensorSpec
from pipeline.core.errors import InputError

GENERATED_BATCH = 16  # samples generated on the batch axis when no evaluation data is given
SEQUENCE_BASE = 4  # first size tried for a symbolic dim that is not spatial (e.g. "sequence")
SPATIAL_BASE = 32  # first size tried for a free height or width without a hint
LADDER_STEPS = 5  # sizes tried per dim: base, 2x, 4x, 8x, 16x
MAX_GENERATED_VALUES = 2**27  # values in one generated input (512 MiB of float32); a larger one needs --eval-data

Probe = Callable[[dict[str, np.ndarray]], str | None]  # runs the model; returns why it failed, or None


def free_name(tensor: str, axis: int) -> str:
    """The name a free dim gets in the manifest: its tensor and axis, so no two free dims share one."""
    return f"{tensor}_dim{axis}"


def graph_dims(value: onnx.ValueInfoProto) -> list[int | str]:
    """A graph value's dims: positive values as ints, real names kept, every other spelling a free dim.

    A `dim_value` of 0 or less (paddle2onnx's -1) is not a size any served tensor has: it is free.
    """
    dims: list[int | str] = []
    for axis, dim in enumerate(value.type.tensor_type.shape.dim):
        if dim.HasField("dim_value") and dim.dim_value > 0:
            dims.append(int(dim.dim_value))
        elif dim.HasField("dim_param") and is_dim_name(dim.dim_param):
            dims.append(dim.dim_param)
        else:
            dims.append(free_name(value.name, axis))
    return dims


def write_dims(model: onnx.ModelProto, inputs: list[TensorSpec], outputs: list[TensorSpec]) -> bool:
    """Write the specs' dims into the graph's inputs and outputs; True when anything changed."""
    specs = {spec.name: spec for spec in [*inputs, *outputs]}
    changed = False
    for value in [*model.graph.input, *model.graph.output]:
        spec = specs.get(value.name)
        if spec is None:  # an initializer listed as an input by an old IR version
            continue
        dims = value.type.tensor_type.shape.dim
        if len(dims) != len(spec.shape):  # an output taken as computed, of another rank than declared
            del dims[:]
            for _ in spec.shape:
                dims.add()
            changed = True
        for dim, wanted in zip(dims, spec.shape, strict=True):
            if isinstance(wanted, int) and (not dim.HasField("dim_value") or dim.dim_value != wanted):
                dim.dim_value, changed = wanted, True
            elif isinstance(wanted, str) and (not dim.HasField("dim_param") or dim.dim_param != wanted):
                dim.dim_param, changed = wanted, True
    return changed


def _batch_dims(inputs: list[TensorSpec]) -> set[str]:
    return {s.shape[s.sample_axis] for s in inputs if s.shape and isinstance(s.shape[s.sample_axis], str)}


def _spatial_axes(spec: TensorSpec) -> tuple[int, ...]:
    if len(spec.shape) != 4:
        return ()
    return (1, 2) if spec.layout == "NHWC" else (2, 3)


def _base(spec: TensorSpec, axis: int) -> int:
    """The first size tried for a symbolic dim: the model's own hint for height and width, else a default."""
    spatial = _spatial_axes(spec)
    if axis not in spatial:
        return SEQUENCE_BASE
    if record := image_record(spec):  # --image-preprocessing: the size pictures are made (a crop, a letterbox)
        return record.input_size[spatial.index(axis)]
    other = spec.shape[spatial[1 - spatial.index(axis)]]
    return other if isinstance(other, int) else SPATIAL_BASE


def generated_inputs(
    specs: list[TensorSpec],
    sizes: dict[str, int],
    batch: int,
    seed: int = 0,
    ranges: dict[str, tuple[int, int]] | None = None,
) -> dict[str, np.ndarray]:
    """Inputs of the right dtype: `batch` on every batch axis, `sizes` for other symbolic dims.

    `ranges`: [low, high) of an integer input's values (token ids below their embedding's rows, masks 1,
    token types 0: pipeline/export/token_graph.py); other integer inputs get small ids, 0..7."""
    rng = np.random.default_rng(seed)
    batch_dims = _batch_dims(specs)
    arrays = {}
    for spec in specs:
        shape = [
            d
            if isinstance(d, int)
            else batch
            if (i == spec.sample_axis or d in batch_dims)
            else sizes.get(d, SEQUENCE_BASE)
            for i, d in enumerate(spec.shape)
        ]
        if (values := np.prod(shape, dtype=object)) > MAX_GENERATED_VALUES:  # object: exact, no int64 overflow
            raise InputError(
                f"generated input {spec.name!r} would be {shape} ({values:,} values), more than the "
                f"{MAX_GENERATED_VALUES:,} pipe generates; pass --eval-data with real inputs, or smaller dims "
                "with --input-shape"
            )
        dtype = np.dtype(spec.dtype)
        if dtype == np.bool_:
            arrays[spec.name] = rng.integers(0, 2, shape).astype(bool)
        elif np.issubdtype(dtype, np.integer):
            low, high = (ranges or {}).get(spec.name, (0, 8))  # small ids: valid for any vocabulary
            arrays[spec.name] = rng.integers(low, high, shape).astype(dtype)
        else:
            arrays[spec.name] = rng.standard_normal(shape).astype(dtype)
    return arrays


def guessed_sizes(inputs: list[TensorSpec], sizes: dict[str, int], hints: dict[str, int] | None) -> list[str]:
    """A note for each input whose generated size no graph, metadata or flag gave: the golden inputs, the gate
    and a later `pipe export --target edge` (which fixes them) use it, so it is said, with the flag that gives it."""
    notes = []
    for spec in inputs:
        guessed = [d for d in spec.shape if isinstance(d, str) and d in sizes and not (hints or {}).get(d)]
        guessed = [d for d in guessed if not (_spatial_axes(spec) and image_record(spec))]
        if not guessed:
            continue
        example = ",".join(str(d) if isinstance(d, int) else "<size>" if d in guessed else FREE for d in spec.shape)
        shown = ", ".join(f"{d} {sizes[d]}" for d in guessed)
        notes.append(
            f"input {spec.name!r}: size guessed ({shown}: the first size the model runs at, not one it states); "
            f"golden inputs, the gate and edge conversion use it. Give the real one with --input-shape "
            f"{spec.name}:{example}"
        )
    return notes


def _batch_axis_advice(
    inputs: list[TensorSpec], bases: dict[str, int], probe: Probe, ranges: dict[str, tuple[int, int]] | None
) -> str | None:
    """When the model runs only once an inner dim equals the batch (Silero VAD's state [2, batch, 128]), the
    flag that declares that axis the batch; None when no single dim does it."""
    for spec in inputs:
        for axis, dim in enumerate(spec.shape):
            if axis == spec.sample_axis or dim not in bases:
                continue
            sizes = {d: (1 if d == dim else base) for d, base in bases.items()}  # the probe runs one sample
            if probe(generated_inputs(inputs, sizes, 1, ranges=ranges)) is None:
                return (
                    f"it runs when {spec.name!r} dim {axis} ({dim}) is the batch size: if that axis holds the samples, "
                    f"declare it with --batch-axis {spec.name}:{axis}"
                )
    return None


def choose_sizes(
    inputs: list[TensorSpec],
    probe: Probe,
    source: str,
    hints: dict[str, int] | None = None,
    ranges: dict[str, tuple[int, int]] | None = None,
) -> dict[str, int]:
    """A size for each symbolic dim that is not a batch: the first on the ladder that the model runs at,
    together with half of it. Exit 2 when none is found, naming the sizes tried and the fix.

    `hints`: a first size for some dims by name (the image size the exporter recorded). `ranges`: the
    values of integer inputs, as `generated_inputs` takes them.
    """
    batch_dims = _batch_dims(inputs)
    bases: dict[str, int] = {}
    for spec in inputs:
        for axis, dim in enumerate(spec.shape):
            if axis != spec.sample_axis and isinstance(dim, str) and dim not in batch_dims:
                base = (hints or {}).get(dim) or _base(spec, axis)
                bases[dim] = max(bases.get(dim, 0), base)
    if not bases:
        return {}
    reasons = []
    for step in range(LADDER_STEPS):
        sizes = {dim: base << step for dim, base in bases.items()}
        why = probe(generated_inputs(inputs, sizes, 1, ranges=ranges))
        if why is None:
            why = probe(generated_inputs(inputs, {d: max(1, s // 2) for d, s in sizes.items()}, 1, ranges=ranges))
            why = None if why is None else f"runs at {sizes} but not at half: {why}"
        if why is None:
            return sizes
        reasons.append(why)
    if "must be within" in reasons[0] and "idx=" in reasons[0]:  # an index past a table: not a size problem
        raise InputError(
            f"onnxruntime cannot run {source} on generated inputs: {reasons[0]}; an integer input indexes a table "
            "the generated ids run past: name the vocabulary with --vocab-size (token ids), or pass --eval-data "
            "with real inputs"
        )
    if advice := _batch_axis_advice(inputs, bases, probe, ranges):
        raise InputError(f"onnxruntime cannot run {source} on generated inputs: {reasons[0]}; {advice}")
    tried = ", ".join(f"{dim} {base}..{base << (LADDER_STEPS - 1)}" for dim, base in bases.items())
    spec = next(s for s in inputs if any(d in bases for d in s.shape))
    example = ",".join(str(d) if isinstance(d, int) else "<size>" if d in bases else FREE for d in spec.shape)
    raise InputError(
        f"onnxruntime cannot run {source} on generated inputs at any size tried for its symbolic dims "
        f"({tried}): {reasons[0]}; give the sizes it takes with --input-shape {spec.name}:{example}, "
        "or pass --eval-data"
    )
