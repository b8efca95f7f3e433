"""Human-readable views of an artifact for the terminal (`pipe info`, and the readings `pipe import` prints).

`manifest_table` shows one version; `model_overview` every version of a model directory, one line
each with its stages and status (trained but not exported, damaged and why, unfinished), so a user
sees at a glance what the next command is.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from pipeline.artifact.directory import Artifact, is_version_name, version_dirs
from pipeline.artifact.generation import Generation
from pipeline.artifact.manifest import MANIFEST_NAME, Manifest
from pipeline.artifact.preprocessing import ImageRecord, image_record, parse_image_record
from pipeline.artifact.records import ImportRecord
from pipeline.artifact.tensors import Feature
from pipeline.artifact.variants import EDGE_PREFIX
from pipeline.core.errors import ArtifactError, InputError, PipelineError
from pipeline.report.markdown import shape, size
from pipeline.samples.evaluation import GENERATED_NOTE, judged_on_generated

COLUMNS_SHOWN = 12  # a table input's column names (and a column's categories) listed before "..."


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


def manifest_table(artifact: Artifact) -> str:
    """A compact summary of the manifest: identity, I/O, metrics, files and variants."""
    m = artifact.manifest
    lines = [
        f"{m.name} v{m.version}  ({m.task}, created {m.created})",
        f"  path      {artifact.root}",
        f"  backend   {m.lineage.backend or '-'}   seed {_or_dash(m.lineage.seed)}   pipe {m.lineage.code_version}",
    ]
    if m.labels:
        shown = ", ".join(m.labels[:10]) + (" ..." if len(m.labels) > 10 else "")
        lines.append(f"  labels    {len(m.labels)}: {shown}")
    if m.detection is not None:
        lines.append(f"  detection {reading_text('detection', asdict(m.detection))}")
    for kind, specs in (("input", m.inputs), ("output", m.outputs)):
        for spec in specs:
            lines.append(f"  {kind:<9} {spec.name}: {spec.dtype} {shape(spec.shape)} {spec.layout}")
            if record := image_record(spec):  # checked when the manifest loaded
                lines.append(f"            pictures: {_pictures(record)}")
            if spec.features:
                lines += [f"            {line}" for line in _columns(spec.features)]
            if (tokens := spec.tokens) is not None:
                limits = f"values 0..{tokens.vocab_size - 1}, padding {tokens.padding_id}"
                lines.append(f"            tokens: {tokens.role}, {limits}, max length {tokens.max_length}")
    if m.tokenizer is not None:
        lines.append(f"  tokenizer {m.tokenizer.file}: takes text (serve: the 'text' input; predict --text)")
    if m.generation is not None:
        lines += generation_lines(m.generation)
    if judged_on_generated(m):
        lines.append(f"  golden    {GENERATED_NOTE} (imported without --eval-data)")
    if m.metrics:
        lines.append("  metrics   " + "  ".join(f"{k}={v:.4g}" for k, v in sorted(m.metrics.items())))
    if m.files:
        lines.append("  files")
        width = max(len(rel) for rel in m.files)
        for rel, entry in sorted(m.files.items()):
            lines.append(f"    {rel:<{width}}  {size(entry.size):>10}  sha256 {entry.sha256[:12]}")
    if m.variants:
        lines.append("  variants")
        for name, v in sorted(m.variants.items()):
            metrics = "  ".join(f"{k}={val:.4g}" for k, val in sorted(v.metrics.items()))
            status = v.status if v.passed else f"FAILED ({v.reason})"
            lines.append(f"    {name:<12} {v.format}/{v.precision:<5} {v.file}  {status}  {metrics}".rstrip())
    if names := m.stages.names():
        lines.append("  stages    " + ", ".join(names))
    if m.stages.import_ is not None:
        lines += import_lines(m.stages.import_)
    return "\n".join(lines)


def generation_lines(g: Generation) -> list[str]:
    """A decoder's generation record, readable: the cache a server allocates, when generation stops, the
    context, the chat template (its sha256 is part of the model's identity) and the sampling defaults."""
    cache = g.cache
    heads = f"{cache.kv_heads} KV head{'s' if cache.kv_heads != 1 else ''}"
    lines = [
        f"  generation cache {cache.layers} layers x {heads} x {cache.head_size} ({cache.dtype}): "
        f"{size(cache.bytes_per_token())} per token of context per row",
        *(
            [f"            {cache.windows_said()} (in the mask: every layer keeps its whole past)"]
            if cache.windows
            else []
        ),
        f"            inputs {cache.past.format(layer='N', kind='key|value')} -> outputs "
        f"{cache.present.format(layer='N', kind='key|value')}",
        f"            stops at EOS {', '.join(map(str, g.eos_token_ids))}; pads prompts on the left with "
        f"{g.padding_id}; BOS {_or_dash(g.bos_token_id)}; context "
        + (f"{g.context_length} tokens" if g.context_length else "not recorded"),
    ]
    if g.chat_template is not None:
        lines.append(f"            chat template {g.chat_template}  sha256 {_or_dash(g.chat_template_sha256)}")
    else:
        lines.append("            chat template none (instruction data and chat requests need one)")
    if g.defaults:
        shown = ", ".join(f"{k} {v}" for k, v in sorted(g.defaults.items()))
        lines.append(f"            defaults {shown} (from {g.generation_config or 'the config'})")
    return lines


def _pictures(record: ImageRecord) -> str:
    """How a picture becomes the input, in one line: `RGB, resize_short 256, crop 224x224, bilinear, scale 0.003922`."""
    if record.letterbox is not None:
        geometry = f"letterbox {_size(record.letterbox.size)} pad {record.letterbox.pad}"
    elif record.resize_short is not None:
        geometry = f"resize_short {record.resize_short}"
    else:
        geometry = f"stretch to {_size(record.size)}"
    if record.crop is not None:
        geometry += f", crop {_size(record.crop)}"
    return f"{record.mode}, {geometry}, {record.resize}, scale {record.scale:.4g}"


def _columns(features: list[Feature]) -> list[str]:
    """A table input's columns, in input order, and each categorical column's categories."""
    names = [f.name for f in features]
    more = f" ... ({len(names) - COLUMNS_SHOWN} more)" if len(names) > COLUMNS_SHOWN else ""
    shown = ", ".join(names[:COLUMNS_SHOWN]) + more
    lines = [f"columns: {len(names)}: {shown}"]
    for f in features:
        if f.categories:
            cats = ", ".join(f.categories[:COLUMNS_SHOWN]) + (" ..." if len(f.categories) > COLUMNS_SHOWN else "")
            lines.append(f"  {f.name}: {len(f.categories)} categories: {cats}")
    return lines


def _size(size: tuple[int, int] | None) -> str:
    return "x".join(str(d) for d in size or ())


VALUE_SHOWN = 70  # characters of a metadata value `pipe info` shows


def import_lines(record: ImportRecord) -> list[str]:
    """What the exporter recorded in the model's metadata, and what `pipe import` made of it, with sources."""
    lines = [f"  imported  {record.source} ({record.convention or 'no known exporter convention'}, "
             f"producer {record.producer or '-'}, opset {_or_dash(record.opset)})"]  # fmt: skip
    if record.metadata:
        lines.append(f"  metadata  {len(record.metadata)} key(s) in metadata_props")
        width = min(max(len(key) for key in record.metadata), 24)
        for key, value in record.metadata.items():
            used = [what for what, r in record.read.items() if f"metadata_props[{key!r}]" in r.source]
            shown = value if len(value) <= VALUE_SHOWN else value[: VALUE_SHOWN - 3] + "..."
            mark = f"  -> {', '.join(used)}" if used else ""
            lines.append(f"    {key[:24]:<{width}}  {shown!r}{mark}")
    else:
        lines.append("  metadata  none (metadata_props is empty)")
    for i, (what, reading) in enumerate(record.read.items()):
        head = "  read      " if i == 0 else "            "
        lines.append(f"{head}{what} {reading_text(what, reading.value)} <- {reading.source}")
    lines += [f"  note      {note}" for note in record.notes]
    return lines


def reading_text(what: str, value: Any) -> str:
    """One thing the import read (`stages.import.read`), as a person reads it."""
    if what == "labels":
        return f"{value} labels"
    if what == "image_size" and isinstance(value, list) and len(value) == 2:
        return f"{value[0]}x{value[1]}"
    if what == "image" and isinstance(value, dict):
        try:
            return _pictures(parse_image_record(value, "image"))
        except InputError:  # a hand-edited record: shown as it is
            return str(value)
    if what == "detection" and isinstance(value, dict):
        text = (f"confidence > {value.get('confidence')}, NMS IoU {value.get('iou')}, "
                f"max {value.get('max_detections')} boxes per picture")  # fmt: skip
        return text + (f", stride {value['stride']}" if value.get("stride") else "")
    if what == "tokens" and isinstance(value, dict):
        shown = ("vocab_size", "padding_id", "max_length", "type_count", "inputs")
        return ", ".join(f"{key} {value.get(key)}" for key in shown)
    return str(value)


def describe_path(path: Path) -> tuple[str, list[str]]:
    """The overview of a model directory (or of each model under a repository) and the damaged versions.

    A bare ONNX file is not an artifact: the error names the `pipe import` command that makes one.
    """
    if path.is_file() and path.suffix.lower() == ".onnx":
        raise InputError(
            f"{path} is an ONNX model, not an artifact; make one from it with: "
            f"pipe import {path} --name NAME (then: pipe info artifacts/NAME)"
        )
    if path.is_file():
        raise ArtifactError(f"{path} is a file, not an artifact; pass artifacts/<name>[/<version>]")
    if not path.is_dir():
        raise ArtifactError(f"artifact {path} does not exist; pass artifacts/<name>[/<version>]")
    models = [path] if _version_names(path) else sorted(p for p in path.iterdir() if _version_names(p))
    if not models:
        raise ArtifactError(f"{path} holds no artifact: no {MANIFEST_NAME} in it or in a numbered version under it")
    blocks, damaged = [], []
    for model in models:
        text, broken = model_overview(model)
        blocks.append(text)
        damaged += broken
    return "\n\n".join(blocks), damaged


def model_overview(model_root: Path) -> tuple[str, list[str]]:
    """Every version of a model directory, newest last: stages and status on one line each.

    Returns the text and the versions that did not load (named `NAME vN`).
    """
    loaded = version_dirs(model_root)
    unfinished = [n for n in _version_names(model_root) if n not in loaded]
    numbers = sorted([*loaded, *unfinished])
    lines = [f"{model_root.name}: {len(numbers)} version(s) in {model_root}"]
    damaged = []
    for number in numbers:
        if number not in loaded:
            lines.append(
                f"  v{number:<4} unfinished: no {MANIFEST_NAME} (training is running, or it stopped: "
                "pipe train RECIPE --resume)"
            )
            continue
        try:
            artifact = Artifact.load(loaded[number])
        except (PipelineError, OSError) as exc:
            reason = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
            lines.append(f"  v{number:<4} damaged: {reason[:300]}")
            damaged.append(f"{model_root.name} v{number}")
            continue
        status, stages = version_summary(artifact)
        metrics = "  ".join(f"{k}={v:.4g}" for k, v in sorted(artifact.manifest.metrics.items()))
        lines.append(f"  v{number:<4} {status}" + (f"  {metrics}" if metrics else ""))
        lines.append(f"        stages: {stages}")
    return "\n".join(lines), damaged


def version_summary(artifact: Artifact) -> tuple[str, str]:
    """(status, stages) of one loaded version: what it is ready for, and every stage that ran."""
    m = artifact.manifest
    stages = []
    if m.stages.train is not None:
        stages.append(f"trained {m.stages.train.finished[:16].replace('T', ' ')}")
    if m.stages.import_ is not None:
        stages.append("imported")
    exported = m.stages.export is not None or m.stages.import_ is not None
    if m.stages.export is not None:
        stages.append("exported")
    lossy = sorted(n for n, v in m.variants.items() if v.format == "onnx" and n != "fp32")
    if lossy:
        stages.append("variants " + ", ".join(_variant(m, n) for n in lossy))
    edge = sorted(n for n, v in m.variants.items() if v.format == "tflite")
    if edge:
        stages.append("edge " + ", ".join(_variant(m, n).removeprefix(EDGE_PREFIX) for n in edge))
    if m.stages.check is not None:
        stages.append("check " + ("passed" if m.stages.check.passed else "FAILED"))
    if m.stages.benchmark is not None:
        stages.append("benchmark")
    if m.stages.report is not None:
        stages.append("report")
    root = artifact.root
    if not exported:
        status = f"trained, not exported (next: pipe export {root})"
    elif m.stages.check is not None and not m.stages.check.passed:
        status = f"exported, check FAILED ({'; '.join(m.stages.check.failures[:2])[:160]})"
    elif "fp32" in m.variants and not m.variants["fp32"].passed:
        status = f"export FAILED ({m.variants['fp32'].reason})"
    else:
        status = "imported, servable" if m.stages.import_ is not None else "exported, servable"
    return status, ", ".join(stages) or "none recorded"


def _variant(manifest: Manifest, name: str) -> str:
    return name if manifest.variants[name].passed else f"{name} (failed)"


def _version_names(model_root: Path) -> list[int]:
    """Every version-named directory, with or without a manifest (an unfinished run has none)."""
    try:
        return sorted(int(p.name) for p in model_root.iterdir() if is_version_name(p.name) and p.is_dir())
    except OSError:
        return []


def trainable_table(path: str, *, verify: bool = True) -> str:
    """model.onnx's float initializers, one a line with shape and dtype: what `--trainable PATTERN` matches."""
    import onnx

    from pipeline.artifact.directory import Artifact, resolve_artifact
    from pipeline.artifact.variants import MODEL_FILE
    from pipeline.core.errors import ArtifactError
    from pipeline.train.ort_start import FLOAT_TYPES

    artifact = Artifact.load(resolve_artifact(path), verify=verify)
    if MODEL_FILE not in artifact.manifest.files:
        raise ArtifactError(f"{artifact.root} holds no model.onnx; export it first (pipe export {artifact.root})")
    graph = onnx.load(artifact.path(MODEL_FILE), load_external_data=False).graph
    rows = [
        (i.name, "x".join(map(str, i.dims)), onnx.helper.tensor_dtype_to_np_dtype(i.data_type).name)
        for i in graph.initializer
        if i.data_type in FLOAT_TYPES and len(i.dims) > 0
    ]
    width = max([len("parameter"), *(len(r[0]) for r in rows)])
    lines = [f"{'parameter':<{width}}  shape      dtype", *(f"{n:<{width}}  {s:<9}  {d}" for n, s, d in rows)]
    lines.append(
        f"{len(rows)} parameter(s) in {artifact.root / MODEL_FILE}; train some with: pipe train --from "
        f"{artifact.root} --trainable 'PATTERN' --data FILE.npz"
    )
    return "\n".join(lines)
