"""onnxruntime's quantization pre-processing (`quant_pre_process`) as the quantizing kinds run it.

It fuses and infers shapes before quantizing; it can fail on graphs it cannot follow (contrib ops after an
extended graph optimization), and it renames the nodes it fuses. `preprocess` falls back to onnx shape
inference, then to no pre-processing, saying why, follows an excluded node to its new name, and keeps one
result per graph in a search's `QuantCache`. `quiet_advice` drops onnxruntime's warnings that say nothing to a
pipe user.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from onnxruntime.quantization import quant_pre_process

from pipeline.core.errors import first_line
from pipeline.optimize.cache import Preprocessed, QuantCache
from pipeline.optimize.graph import load
from pipeline.runtime.external_data import SMALL_TENSOR, data_file


class _PreprocessAdvice(logging.Filter):
    """Drops two onnxruntime warnings that say nothing to a pipe user: its advice to run pre-processing
    (pipe runs it, or reports why not), and "Axis 1 is out-of-range for weight" for every 1-D weight
    (a LayerNorm scale) under per-channel quantization, which it then quantizes per tensor as it should.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        advice = "consider" in message and "pre-processing" in message
        return not advice and "is out-of-range for weight" not in message


@contextlib.contextmanager
def quiet_advice() -> Iterator[None]:
    root, advice = logging.getLogger(), _PreprocessAdvice()
    root.addFilter(advice)
    try:
        yield
    finally:
        root.removeFilter(advice)


@contextlib.contextmanager
def _working_directory(path: Path) -> Iterator[None]:
    """Run inside `path`: onnxruntime's symbolic shape inference, when it gives up, dumps
    `sym_shape_infer_temp.onnx` and a uuid-named weights file into the current directory, which
    would litter the user's working directory (or the repository). pipe optimize runs this on its
    main thread alone, so changing the process's directory for the call is safe here.
    """
    before = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def preprocess(
    named: Path,
    out: Path,
    excluded: list[str],
    warnings: list[str],
    cache: QuantCache | None = None,
    external: bool = False,
) -> tuple[Path, list[str], bool]:
    """onnxruntime's pre-processing of `named` into `out`: (the model to quantize, its exclusions, ran).

    Symbolic shape inference fails on graphs holding contrib ops (e.g. after an extended graph
    optimization), so a second try skips it. A node a fusion renamed (`MatMul_3` -> `MatMul_3/MatMulAddFusion`)
    is followed to its new name; an excluded node that vanished keeps the model unprocessed.
    With `cache`, a graph pre-processed before is not pre-processed again (same result, same warnings).
    """
    kept = cache.preprocessed(named, out) if cache is not None else None
    if kept is None:
        kept = _run(named, out, external)
        if cache is not None:
            cache.keep_preprocessed(named, kept.path, kept.warnings)
    warnings += kept.warnings
    if kept.path is None:
        return named, excluded, False
    names = [node.name for node in load(out).graph.node]
    followed = []
    for name in excluded:
        renamed = [n for n in names if n == name or n.startswith(f"{name}/")]
        if not renamed:
            warnings.append(f"pre-processing removed excluded node {name!r}; quantized without pre-processing")
            return named, excluded, False
        followed += renamed
    return out, followed, True


def _run(named: Path, out: Path, external: bool = False) -> Preprocessed:
    error, warnings = "", []
    # a model with external data is written so again (onnxruntime's tool writes one file past 2 GiB otherwise)
    saving = dict(save_as_external_data=True, all_tensors_to_one_file=True, external_data_location=data_file(out).name,
                  external_data_size_threshold=SMALL_TENSOR) if external else {}  # fmt: skip
    for skip_symbolic in (False, True):
        try:
            source, target = named.resolve(), out.resolve()  # absolute before the call runs elsewhere
            with _working_directory(target.parent):
                data_file(target).unlink(missing_ok=True)  # onnx appends to a data file that exists
                quant_pre_process(str(source), str(target), skip_symbolic_shape=skip_symbolic, **saving)
            break
        except Exception as exc:  # shape inference raises bare Exception on graphs it cannot follow
            error = f"{type(exc).__name__}: {first_line(exc)}"
    else:
        return Preprocessed(None, [f"pre-processing failed ({error}); quantized without it"])
    if error:
        warnings.append(f"symbolic shape inference failed ({error}); pre-processed with onnx shape inference only")
    return Preprocessed(out, warnings)
