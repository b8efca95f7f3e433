"""Conversion that tries what works: a short ordered list of onnx2tf settings, each result judged.

onnx2tf converts many graphs only with the right options, and which ones is known for the models
people bring (docs/edge.md, The conversion): a YOLOv8 head needs onnxslim first, onnx2tf's own onnxsim
off, `disable_group_convolution` and `enable_batchmatmul_unfold` (Ultralytics' own TFLite export
uses them); an attention block that onnx2tf stops on may pass with its parameter-replacement file,
or without onnxslim, where a GELU's Erf must become builtin ops (`replace_to_pseudo_operators`): as
TensorFlow's Select op `FlexErf` no device interpreter loads it.
`convert_in_turn` tries `ATTEMPTS` in order (a detector starts with the Ultralytics settings) and
hands each conversion to the caller's `judge`, the gate on LiteRT (pipeline/edge/litert_gate.py),
whose judgement says why the attempt is left (`failure`) or None; the first it accepts is used, and
its judgement is what `convert_in_turn` returns.
An attempt is left when onnx2tf fails, LiteRT cannot load what it wrote, or its fp32 model fails the
gate the way a conversion fails (an input refused, a wrong shape, NaN, values wrong wholesale: the
conversion's own correctness, which other settings may fix). A verdict about accuracy (a few values
past atol, the metric a little off) stops the search: the attempt is used, its models recorded as the
gate judged them, and the judgement's `stopped` says why no other setting was tried. A precision's own
loss (fp16, int8) is not a reason to convert again either. Every attempt is recorded (`ConvertAttempt`)
with why it was left, or why the search stopped at it.

When every attempt converted but none passed, the first conversion's judgement is returned (and
recorded as failed by the stage); when none converted, `NotConverted` is raised with the last
reason and every attempt. All of them together run within the settings' `timeout_s` (`edge.timeout_s`,
`--convert-timeout`), each at most `ATTEMPT_SHARE` of it: an attempt stopped there, or skipped because the
time was spent, says so and names the setting that gives more, so a run that ends on time is never read as
a conversion onnx2tf refused.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from pipeline.artifact.records import ConvertAttempt
from pipeline.core.errors import ArtifactError, CheckFailed, first_line
from pipeline.edge.convert import COPY, Converted, EdgeSettings, Progress, convert
from pipeline.edge.onnx2tf_child import LOG

ATTEMPT_SHARE = 1 / 3  # of timeout_s, one onnx2tf run at most (600 s of the default 1800): a YOLOv8n that fails
# takes about 3.5 min to say so, a 90 MB transformer 1.4 min with onnx2tf's own onnxsim
TIMEOUT_ADVICE = "raise edge.timeout_s (--convert-timeout SECONDS, or the edge: section of --settings FILE)"
FLEX = re.compile(rb"Flex[A-Z][A-Za-z0-9]*")  # a Select op's custom name in a .tflite file, e.g. FlexErf
AUTO_JSON = "_auto.json"  # onnx2tf writes <model>_auto.json, a parameter-replacement guess, when it stops on a node


class Judgement(Protocol):
    """What `judge` says of one attempt's models."""

    @property
    def failure(self) -> str | None:
        """Why the attempt is left, or None to use it."""
        ...

    @property
    def stopped(self) -> str | None:
        """Why the search stops at an attempt it uses though its models failed (accuracy, not conversion)."""
        ...


JudgementT = TypeVar("JudgementT", bound=Judgement)


@dataclass(frozen=True)
class Attempt:
    """One way of running onnx2tf."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)  # onnx2tf.convert keyword arguments
    slim: bool = True  # onnxslim first, onnx2tf's onnxsim off
    replacement: bool = False  # pass the parameter-replacement file the previous failed attempt left
    batch_one: bool = False  # the copy's batch fixed at 1: the edge models take one sample a call


ULTRALYTICS = {"disable_group_convolution": True, "enable_batchmatmul_unfold": True}
ATTEMPTS = (
    Attempt("onnxslim"),
    Attempt("onnxslim + ultralytics", ULTRALYTICS),
    Attempt("onnxslim + parameter replacement", {}, replacement=True),
    Attempt("onnx2tf alone (its own onnxsim)", slim=False),
    Attempt("onnx2tf alone + builtin Erf", {"replace_to_pseudo_operators": ["erf"]}, slim=False),
)


# onnx2tf 1.28.8 writes TFLite's TRANSPOSE_CONV output shape from the ONNX one, and a free batch in it stops the
# conversion (`Expected int32 ... got ['unk__6', 160, 160, 24]`, PP-OCRv4's detector at every setting above);
# with the batch fixed at 1 on the copy it converts. The gate and the runner then feed one sample a call.
BATCH_ONE = Attempt("onnxslim, batch fixed at 1", batch_one=True)
NEEDS_FIXED_BATCH = frozenset({"ConvTranspose"})  # ops onnx2tf converts only at a fixed batch


def attempts_for(task: str, ops: frozenset[str] | set[str] = frozenset()) -> tuple[Attempt, ...]:
    """`ATTEMPTS`, with the Ultralytics settings first for a detector (a failed default costs minutes), and first of
    all the batch fixed at 1 for a model holding an op in NEEDS_FIXED_BATCH (`ops`: the graph's op types)."""
    ordered = ATTEMPTS
    if task == "detection":
        first = [a for a in ATTEMPTS if a.options == ULTRALYTICS]
        ordered = (*first, *[a for a in ATTEMPTS if a not in first])
    return (BATCH_ONE, *ordered) if NEEDS_FIXED_BATCH & set(ops) else ordered


def op_types(path: Path) -> frozenset[str]:
    """The op types of the ONNX file at `path`, its subgraphs' too (weights not read)."""
    import onnx

    graphs, found = [onnx.load(str(path), load_external_data=False).graph], set()
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            found.add(node.op_type)
            graphs += [a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]
            graphs += [g for a in node.attribute if a.type == onnx.AttributeProto.GRAPHS for g in a.graphs]
    return frozenset(found)


class NotConverted(CheckFailed):
    """No attempt converted the model: the last reason, with every attempt."""

    def __init__(self, message: str, attempts: list[ConvertAttempt], log: Path | None) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.log = log


def convert_in_turn(
    onnx_path: Path,
    workdir: Path,
    settings: EdgeSettings,
    calibration: dict[str, np.ndarray] | None,
    judge: Callable[[list[Converted]], JudgementT],
    attempts: tuple[Attempt, ...] = ATTEMPTS,
    progress: Progress | None = None,
) -> tuple[JudgementT, list[ConvertAttempt]]:
    """The judgement of the first attempt `judge` accepts (its `failure` is None); see the module doc."""
    say = progress or (lambda _message: None)
    tried: list[ConvertAttempt] = []
    first: JudgementT | None = None
    replacement: Path | None = None
    log: Path | None = None
    started = time.monotonic()
    for n, attempt in enumerate(attempts, 1):
        left = settings.timeout_s - (time.monotonic() - started)
        record, dims = _attempt_record(attempt, settings)
        tried.append(record)
        if attempt.replacement and replacement is None:
            record.reason = "skipped: no earlier attempt left a parameter-replacement file"
            continue
        if left < 1:
            record.reason = f"skipped: edge.timeout_s ({settings.timeout_s:g} s) was spent; {TIMEOUT_ADVICE}"
            continue
        options = dict(attempt.options)
        if attempt.replacement and replacement is not None:
            options["param_replacement_file"] = str(replacement.resolve())
            record.options = {"param_replacement_file": json.loads(replacement.read_text())}
        say(f"onnx2tf attempt {n}/{len(attempts)}: {attempt.name}")
        workspace = Path(workdir) / f"attempt{n}"
        begun = time.monotonic()
        limit = min(settings.timeout_s * ATTEMPT_SHARE, left)
        tuned = replace(settings, slim=attempt.slim, onnx2tf=options, timeout_s=limit, input_dims=dims)
        try:
            made = convert(onnx_path, workspace, tuned, calibration, progress)
        except CheckFailed as exc:
            record.seconds = round(time.monotonic() - begun, 1)
            record.reason = _refusal(exc, limit, settings)
            log = workspace / "onnx2tf" / LOG
            if (guess := workspace / "onnx2tf" / "out" / f"{Path(COPY).stem}{AUTO_JSON}").is_file():
                replacement = guess
            say(f"onnx2tf attempt {n} left: {record.reason[:300]}")
            continue
        record.seconds = round(time.monotonic() - begun, 1)
        for converted in made if attempt.batch_one else []:
            converted.fixed_batch = 1
        try:
            judged = judge(made)
        except ArtifactError as exc:  # a file LiteRT cannot load
            record.reason = _unloadable(exc, made)
            say(f"onnx2tf attempt {n} converted but was left: {record.reason[:300]}")
            continue
        why = judged.failure
        if why is None:
            record.used = True
            record.reason = judged.stopped or ""
            if record.reason:
                say(f"onnx2tf attempt {n}: {record.reason[:300]}")
            return judged, tried
        record.reason = why
        first = first if first is not None else judged
        say(f"onnx2tf attempt {n} converted but was left: {why[:300]}")
    if first is not None:
        for record in tried:
            record.used = False
        return first, tried
    last = next((r.reason for r in reversed(tried) if not r.reason.startswith("skipped")), "no attempt ran")
    raise NotConverted(f"{last}\n{attempts_text(tried)}", tried, log)


def _attempt_record(attempt: Attempt, settings: EdgeSettings) -> tuple[ConvertAttempt, dict[str, list[int | str]]]:
    """The record of `attempt` before it runs, and the input dims its copy takes (the batch fixed at 1 for
    BATCH_ONE: the dims device_specs left free are the batch, and axes named like it)."""
    record = ConvertAttempt(name=attempt.name, options=dict(attempt.options), slim=attempt.slim)
    dims = settings.input_dims
    if attempt.batch_one:
        dims = {name: [1 if isinstance(d, str) else d for d in shape] for name, shape in dims.items()}
        record.options = {**record.options, "fixed_batch": 1}  # pipe's own, on the copy: not an onnx2tf option
    return record, dims


def _refusal(exc: CheckFailed, limit: float, settings: EdgeSettings) -> str:
    """Why onnx2tf failed, as the record keeps it: its first line without the scratch log (which goes away), and
    for a run stopped on time the share of edge.timeout_s it had and the setting that gives more."""
    reason = re.sub(r"(; | \()log: [^)]*\)?$", "", str(exc).splitlines()[0])
    if reason.startswith("onnx2tf did not finish"):
        share = "the time left of" if limit < settings.timeout_s * ATTEMPT_SHARE else "a third of"
        reason += f" ({share} edge.timeout_s, {settings.timeout_s:g} s): {TIMEOUT_ADVICE}"
    return reason


def _unloadable(exc: ArtifactError, made: list[Converted]) -> str:
    """Why LiteRT cannot load what onnx2tf wrote: TensorFlow's Select ops (Flex), which devices lack, named when
    the files hold them; else LiteRT's own first line."""
    flex = sorted({op.decode() for c in made for op in re.findall(FLEX, c.path.read_bytes())})
    if flex:
        return (f"LiteRT cannot load what onnx2tf wrote: it needs TensorFlow's Select ops ({', '.join(flex)}), "
                "which device interpreters do not have")  # fmt: skip
    return first_line(exc)


def attempts_text(tried: list[ConvertAttempt]) -> str:
    """The attempts, one line each, for an error message and the CLI."""
    lines = [f"onnx2tf attempts ({len(tried)}):"]
    for n, a in enumerate(tried, 1):
        state = ("used" + (f"; {a.reason}" if a.reason else "")) if a.used else f"left: {a.reason}"
        lines.append(f"  {n}. {a.name} ({a.seconds:.1f} s): {state}"[:400])
    return "\n".join(lines)


def attempts_markdown(tried: list[ConvertAttempt], fixed: list[dict[str, Any]]) -> str:
    """reports/edge-convert.md: the dims fixed for devices and every conversion tried."""
    lines = ["# Edge conversion", "", "## Device shapes", ""]
    if fixed:
        lines += ["| input | axis | dim | size | from |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| {_cell(f['input'])} | {f['axis']} | {_cell(f['dim'])} | {f['size']} | {_cell(f['source'])} |"
                  for f in fixed]  # fmt: skip
    else:
        lines.append("No free dim but the batch: the edge models take model.onnx's shapes.")
    lines += ["", "## onnx2tf attempts, in order", "", "| # | settings | onnxslim | seconds | outcome |",
              "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for n, a in enumerate(tried, 1):
        options = ", ".join(sorted(a.options)) or "defaults"
        outcome = ("used" + (f"; {a.reason}" if a.reason else "")) if a.used else f"left: {a.reason}"
        lines.append(f"| {n} | {_cell(a.name)} ({_cell(options)}) | {'yes' if a.slim else 'no'} | {a.seconds} | "
                     f"{_cell(outcome)} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def attempts_json(tried: list[ConvertAttempt], fixed: list[dict[str, Any]]) -> str:
    """reports/edge-convert.json: the same as the Markdown, for machines."""
    return json.dumps({"fixed_dims": fixed, "attempts": [asdict(a) for a in tried]}, indent=2) + "\n"


def _cell(text: object) -> str:
    return " ".join(str(text).replace("\\", "\\\\").replace("|", "\\|").split()) or "-"
