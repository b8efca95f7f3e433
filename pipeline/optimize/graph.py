"""Graph optimization: an ONNX file in, a smaller equivalent ONNX file out, and what changed.

Two steps, each kept only when its result passes onnx's checker, still loads and keeps the model's signature:
1. onnxruntime's offline optimizer at level basic (constant folding, redundant node removal) or
   extended (also fusions such as Gelu, LayerNormalization, Attention, FusedConv), on the CPU
   provider. Never ORT_ENABLE_ALL: its layout transforms (NCHWc) are written for the CPU the file
   was made on and must not be saved as a portable model.
2. onnxslim, which folds what is left (Conv+BN, Gemm, redundant Reshape/Transpose...). A failure
   here keeps the onnxruntime result and says so in the report; it is never silent.

The signature is the contract every hop keeps: the same input and output names, element types and
ranks, fixed dims unchanged and free input dims staying free (a batch frozen to 1 is a broken model
that still loads). A free output dim that shape inference wrote as its size or an expression is named
back as declared; what it computes is held by the gate, which runs it. A step that breaks it is refused.
"""

from __future__ import annotations

import contextlib
import io
import re
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import onnx
import onnxruntime as ort
import onnxslim

from pipeline.core.errors import ArtifactError, InputError
from pipeline.runtime.external_data import SMALL_TENSOR, data_file, move_model, uses_external_data

LEVELS = {
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
}
LOWER_FIRST = ("extended", "basic")  # a level whose result is refused is retried at the next one

Model = onnx.ModelProto | Path | str


@dataclass
class Step:
    """One pass over the model: what ran, whether its result was kept, and what it changed."""

    name: str  # "onnxruntime" or "onnxslim"
    version: str
    setting: str  # e.g. "level=extended"
    kept: bool  # False: the step failed or broke the signature; the model before it was kept
    nodes_before: int
    nodes_after: int
    removed: dict[str, int] = field(default_factory=dict)  # op type -> how many fewer
    added: dict[str, int] = field(default_factory=dict)  # op type -> how many more (fused ops)
    note: str = ""  # why a step was not kept


@dataclass
class GraphReport:
    """What optimize_graph did to one model."""

    level: str  # the level that made it: the one asked for, or a lower one where that one's result was refused
    nodes_before: int
    nodes_after: int
    ops_before: dict[str, int]
    ops_after: dict[str, int]
    steps: list[Step]
    warnings: list[str] = field(default_factory=list)
    asked: str = ""  # the level asked for

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def load(model: Model) -> onnx.ModelProto:
    """A ModelProto from a path (or the proto itself), without its external data: the graph and inline
    tensors, and references to weights kept beside it (a multi-GB model is not read; what needs the weights
    gives onnxruntime or onnx the path). Save such a proto only in the directory it was read from."""
    if isinstance(model, onnx.ModelProto):
        return model
    try:
        return onnx.load(str(model), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError, OSError, ... with no common base
        raise ArtifactError(f"{model}: not a readable ONNX model ({exc}); give the path of an .onnx file") from exc


def _graphs(graph: onnx.GraphProto):
    """The graph and every subgraph inside it (If/Loop/Scan bodies), depth first."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _graphs(sub)


def strip_debug_info(model: onnx.ModelProto) -> int:
    """Drop every node's doc string and metadata (an exporter's source locations and stack traces);
    return the bytes saved. Nothing at inference reads them, and in a small model they can weigh
    more than the int8 weights. The model's own metadata (pipe's identity stamp) is kept.
    """
    before = model.ByteSize()
    for graph in _graphs(model.graph):
        for node in graph.node:
            node.ClearField("doc_string")
            node.ClearField("metadata_props")
    return before - model.ByteSize()


def op_type(node: onnx.NodeProto) -> str:
    """`Conv` for the default domain, `com.microsoft.FusedConv` for others."""
    return f"{node.domain}.{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type


def op_counts(model: Model) -> dict[str, int]:
    """How many nodes of each op type the model holds, subgraphs included, sorted by op type."""
    counts = Counter(op_type(node) for graph in _graphs(load(model).graph) for node in graph.node)
    return dict(sorted(counts.items()))


def node_count(model: Model) -> int:
    """The number of nodes in the model, subgraphs included."""
    return sum(op_counts(model).values())


def signature(model: onnx.ModelProto) -> dict[str, list[tuple[str, int, list[str | int | None]]]]:
    """Inputs and outputs as (name, element type, dims); a dim is its name, its size, or None if unknown."""

    def dims(value: onnx.ValueInfoProto) -> list[str | int | None]:
        shape = value.type.tensor_type.shape
        return [d.dim_param or (d.dim_value if d.HasField("dim_value") else None) for d in shape.dim]

    initializers = {init.name for init in model.graph.initializer}
    return {
        side: [(v.name, v.type.tensor_type.elem_type, dims(v)) for v in values if v.name not in initializers]
        for side, values in (("inputs", model.graph.input), ("outputs", model.graph.output))
    }


def _overridable(model: onnx.ModelProto) -> set[str]:
    """Graph inputs that are also initializers: a default a runtime may override."""
    return {v.name for v in model.graph.input} & {init.name for init in model.graph.initializer}


def signature_changes(before: onnx.ModelProto, after: onnx.ModelProto) -> list[str]:
    """Every way `after` breaks the signature of `before`, as declared in the files.

    Names, element types and ranks must stay, and an input with a default (an initializer listed as an input)
    must stay one. An input's fixed dims must stay, and its free dims stay free
    (a batch frozen to 1 is a broken model that still loads). An output's dim may be written as the size
    shape inference computes or as an expression (`Divembedding_dim_1` as 384, a recognizer's 40 or its
    width as `floor((8210*...`): what it computes is held by running it (the gate compares every output
    at several batches), not by its declaration; only a fixed size declared as another is refused. An
    unknown dim may become known.
    """
    old, new = signature(before), signature(after)
    problems = []
    lost = sorted(_overridable(before) - _overridable(after))
    if lost:  # onnxslim folds them (a written decoder's logits_from): a runtime could no longer set them
        problems.append(f"inputs with a default {lost} became constants")
    for side in ("inputs", "outputs"):
        if [v[0] for v in old[side]] != [v[0] for v in new[side]]:
            problems.append(f"{side} {[v[0] for v in old[side]]} became {[v[0] for v in new[side]]}")
            continue
        for (name, type_a, dims_a), (_, type_b, dims_b) in zip(old[side], new[side], strict=True):
            if type_a != type_b:
                problems.append(
                    f"{name}: type {onnx.TensorProto.DataType.Name(type_a)} became "
                    f"{onnx.TensorProto.DataType.Name(type_b)}"
                )
            if len(dims_a) != len(dims_b) or any(
                _dim_changed(a, b, side == "inputs") for a, b in zip(dims_a, dims_b, strict=True)
            ):
                problems.append(f"{name}: shape {dims_a} became {dims_b}")
    return problems


def _dim_changed(before: str | int | None, after: str | int | None, is_input: bool) -> bool:
    if before is None:
        return False  # unknown: anything may be known now
    if is_input:
        return after != before if isinstance(before, int) else not isinstance(after, str)  # free stays free
    return isinstance(before, int) and isinstance(after, int) and after != before  # else run, not declared


def loads_in_onnxruntime(path: Path) -> str:
    """'' when onnxruntime can load the model at `path` on CPU, else the first line of its error (its node
    names whole: see `error_line`)."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's exception types share no base
        return error_line(exc)
    return ""


# how onnxruntime names the node it failed on: `In Node, ("name", Op, ...` or `in node (name)`
_NODE_IN_ERROR = re.compile(r'[Ii]n [Nn]ode,? \("([^"]*)"|[Ii]n [Nn]ode \(([^)]*)\)')
LINE = 300  # characters of an error line kept, beyond the last node name it gives


def error_line(exc: BaseException) -> str:
    """An onnxruntime error's first line, cut after LINE characters but never inside a node name it gives."""
    line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    ends = [match.end() for match in _NODE_IN_ERROR.finditer(line)]
    return line[: max(LINE, *ends)] if ends else line[:LINE]


def failing_nodes(error: str) -> list[str]:
    """The node names an onnxruntime error line gives, in order, each once."""
    found = [a or b for a, b in _NODE_IN_ERROR.findall(error)]
    return list(dict.fromkeys(name for name in found if name))


def _diff(before: dict[str, int], after: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    removed = {op: n - after.get(op, 0) for op, n in before.items() if n > after.get(op, 0)}
    added = {op: n - before.get(op, 0) for op, n in after.items() if n > before.get(op, 0)}
    return removed, added


def _step(
    name: str, version: str, setting: str, before: onnx.ModelProto, after: onnx.ModelProto | None, note: str = ""
) -> Step:
    ops_before = op_counts(before)
    ops_after = op_counts(after) if after is not None else ops_before
    removed, added = _diff(ops_before, ops_after)
    return Step(
        name,
        version,
        setting,
        after is not None,
        sum(ops_before.values()),
        sum(ops_after.values()),
        removed,
        added,
        note,
    )


def run_onnxruntime(src: Path, dst: Path, level: str, external: bool = False) -> None:
    """onnxruntime's offline optimizer at `level`, CPU provider, writing the optimized model to `dst`; with
    `external`, its weights to `<dst>.data` (else it keeps pointing at the source's data file by a location
    that is wrong beside `dst`)."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = LEVELS[level]
    options.optimized_model_filepath = str(dst)
    if external:
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                         data_file(dst).name)  # fmt: skip
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes",
                                         str(SMALL_TENSOR))  # fmt: skip
    try:
        ort.InferenceSession(str(src), sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's exception types share no base
        raise ArtifactError(f"{src}: onnxruntime cannot load the model to optimize it: {error_line(exc)}") from exc


def _checked(candidate: onnx.ModelProto, original: onnx.ModelProto, path: Path) -> str:
    """'' when `candidate`, saved at `path`, loads and keeps `original`'s signature; else why not. A candidate
    with external data is saved in the directory it was read from, beside its data."""
    keep_dim_names(candidate, original)
    onnx.save(candidate, str(path))
    problems = signature_changes(original, candidate)
    if problems:
        return "it changed the signature: " + "; ".join(problems)
    try:  # the gate's checker: onnxruntime's extended fusions can write an op the model's opset lacks
        onnx.checker.check_model(str(path))
    except (onnx.checker.ValidationError, ValueError, OSError) as exc:
        return f"onnx's checker refuses its result: {error_line(exc)}"
    error = loads_in_onnxruntime(path)
    return f"onnxruntime cannot load its result: {error}" if error else ""


def optimize_graph(
    src: Path, dst: Path, level: Literal["basic", "extended"] = "extended", slim: bool = True
) -> GraphReport:
    """Write an optimized copy of the model at `src` to `dst` and report what changed.

    The result runs on any onnxruntime (no hardware-specific layout) and keeps `src`'s signature;
    `src` is never modified. A model with external data is optimized from its path, its weights never
    loaded here, and `dst` keeps its weights beside it as `<dst>.data` (optimize.md, "External data").
    A level whose result is refused is retried at the next lower one (the report's `level` says which
    made it, `asked` what was asked). Raises InputError for an unknown level and ArtifactError when the
    model cannot be read or onnxruntime's pass breaks it at every level.
    """
    if level not in LEVELS:
        raise InputError(f"graph optimization level {level!r} is not one of {', '.join(LEVELS)}")
    original = load(src)
    big = uses_external_data(original)  # weights beside the graph: every step works from paths
    steps: list[Step] = []
    warnings: list[str] = []
    with tempfile.TemporaryDirectory(prefix="pipe-graph-", dir=Path(dst).parent) as scratch:
        current = Path(scratch) / "ort.onnx"  # the file holding the result so far
        made_at, optimized, refused = _onnxruntime_pass(Path(src), current, original, level, big)
        for tried, problem in refused:
            warnings.append(f"onnxruntime's {tried} optimization broke the model ({problem}); made at {made_at}")
        note = "; ".join(f"level {tried} refused: {problem}" for tried, problem in refused)
        steps.append(_step("onnxruntime", ort.__version__, f"level={made_at}", original, optimized, note))
        if slim:
            slim_path = Path(scratch) / "slim.onnx"
            slimmed, note = _slim(current if big else optimized, original, slim_path)
            setting = "default passes, no shape inference, external data" if big else "default passes"
            steps.append(_step("onnxslim", onnxslim.__version__, setting, optimized, slimmed, note))
            if slimmed is None:
                warnings.append(f"onnxslim was not applied, the onnxruntime result is kept: {note}")
            else:
                optimized, current = slimmed, slim_path
        keep_metadata(optimized, original)
        onnx.save(optimized, str(current))  # beside its data, where it was read from
        move_model(current, Path(dst))
    return GraphReport(
        made_at, node_count(original), node_count(optimized), op_counts(original), op_counts(optimized), steps,
        warnings, level,
    )  # fmt: skip


def _onnxruntime_pass(
    src: Path, path: Path, original: onnx.ModelProto, level: str, external: bool
) -> tuple[str, onnx.ModelProto, list[tuple[str, str]]]:
    """onnxruntime's pass at `level`, else at each lower level in turn: (the level that made a model that keeps
    `original`'s signature, passes the checker and loads; that model; each level refused, with why).

    At extended, onnxruntime fuses an opset-12 model's layer norms into LayerNormalization, an opset-17 op the
    checker refuses (PP-OCRv4's recognizer); basic's folding is still worth having. ArtifactError when no level
    makes one, naming each level's problem and `--graph none`."""
    refused: list[tuple[str, str]] = []
    for tried in LOWER_FIRST[LOWER_FIRST.index(level) :]:
        run_onnxruntime(src, path, tried, external)
        optimized = load(path)
        problem = _checked(optimized, original, path)
        if not problem:
            return tried, optimized, refused
        refused.append((tried, problem))
    said = "; ".join(f"at {tried}: {problem}" for tried, problem in refused)
    raise ArtifactError(f"{src}: onnxruntime's optimization broke the model ({said}); skip graph optimization "
                        "(--graph none)")  # fmt: skip


def _slim(model: onnx.ModelProto | Path, original: onnx.ModelProto, path: Path) -> tuple[onnx.ModelProto | None, str]:
    """onnxslim's result, or None and why it was not kept. A model with external data is given by its path and
    slimmed without shape inference, its result written with external data (onnxslim's own advice for it)."""
    try:
        if isinstance(model, Path):
            with contextlib.redirect_stdout(io.StringIO()):  # given an output path, it prints a summary table
                onnxslim.slim(str(model), str(path), no_shape_infer=True, save_as_external_data=True)
            slimmed = load(path) if path.exists() else None
        else:
            slimmed = onnxslim.slim(onnx.ModelProto.FromString(model.SerializeToString()))
    except Exception as exc:  # onnxslim raises whatever its passes hit; the report names it
        return None, f"onnxslim failed: {type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"
    if slimmed is None:
        return None, "onnxslim returned no model"
    problem = _checked(slimmed, original, path)
    return (None, f"onnxslim's result was refused: {problem}") if problem else (slimmed, "")


def keep_dim_names(model: onnx.ModelProto, original: onnx.ModelProto) -> None:
    """Give `model`'s inputs and outputs back the names of `original`'s free dims where a step rewrote them.

    Shape inference (onnxruntime's quantization pre-processing, its offline optimizer, onnxslim) writes a
    free dim it can derive as an expression (a YOLO head's `anchors` becomes `(floor(height/2 - 1/2) ...)`)
    or, on an output, as the size it computes (`Divembedding_dim_1` -> 384): the same model under another
    declaration. An input's free dim is named back only when it is still free (one made fixed is left for
    `signature_changes` to refuse); an output's free dim is always named back, and a fixed output size
    written as an expression is written as the size again; what an output computes is held by running it.
    """
    for side in ("input", "output"):
        declared = {value.name: value for value in getattr(original.graph, side)}
        for value in getattr(model.graph, side):
            before = declared.get(value.name)
            if before is None:
                continue
            dims, old = value.type.tensor_type.shape.dim, before.type.tensor_type.shape.dim
            if len(dims) != len(old):
                continue
            for dim, was in zip(dims, old, strict=True):
                if was.dim_param and dim.dim_param != was.dim_param:
                    if side == "output" or not dim.HasField("dim_value"):
                        dim.dim_param = was.dim_param  # clears dim_value: one of the two
                elif side == "output" and was.HasField("dim_value") and dim.dim_param:
                    dim.dim_value = was.dim_value  # a fixed output size shape inference wrote as an expression


def keep_metadata(model: onnx.ModelProto, original: onnx.ModelProto) -> None:
    """Carry `original`'s metadata_props (identity digest, labels, preprocessing) over if a step dropped them."""
    present = {prop.key for prop in model.metadata_props}
    for prop in original.metadata_props:
        if prop.key not in present:
            model.metadata_props.add(key=prop.key, value=prop.value)
