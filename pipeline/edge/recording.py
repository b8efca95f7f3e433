"""What the edge stage records: each `tflite-<precision>` variant, the `EdgeRecord`, the convert reports.

`record_made` is the StageWrite record step of a run that converted: each model a variant with what
a device program needs (layout, dtypes, shapes, quantization, the runtimes it ran on) and its
status, the edge files and variants of an earlier run that this one did not make again removed,
and the stage record. `record_refused` commits a run onnx2tf refused: the stage record with the
error, onnx2tf's last log and the attempts in reports/, no model file changed.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.artifact.directory import Artifact
from pipeline.artifact.records import ConvertAttempt, EdgeRecord
from pipeline.artifact.stagewrite import StageWrite
from pipeline.artifact.variants import EDGE_PREFIX, MODEL_FILE, EdgeIO, EdgeTensor, Variant, variant_file
from pipeline.core.host import describe_host
from pipeline.edge.attempts import NotConverted, attempts_json, attempts_markdown
from pipeline.edge.convert import Converted
from pipeline.edge.litert_gate import EdgeMade, first_failure
from pipeline.edge.plan import EdgePlan
from pipeline.recipe.schema import EdgeSpec

CONVERT_LOG = "reports/edge-convert.log"  # onnx2tf's own log of a conversion that failed
CONVERT_REPORTS = ("reports/edge-convert.json", "reports/edge-convert.md")  # device shapes and onnx2tf attempts


def write_convert_report(scratch: Path, tried: list[ConvertAttempt], plan: EdgePlan) -> None:
    """reports/edge-convert.{json,md}: the dims fixed for devices and every onnx2tf attempt."""
    (scratch / "reports").mkdir(exist_ok=True)
    (scratch / CONVERT_REPORTS[0]).write_text(attempts_json(tried, plan.fixed_rows))
    (scratch / CONVERT_REPORTS[1]).write_text(attempts_markdown(tried, plan.fixed_rows))


def record_made(
    settings: EdgeSpec,
    parent: str,
    plan: EdgePlan,
    made: list[EdgeMade],
    tried: list[ConvertAttempt],
    written: list[str],
    rewritten: list[str],
) -> Callable[[Artifact], None]:
    """The record step for StageWrite.commit: `made` recorded from the model.onnx of digest `parent`;
    `written` the edge files this run made, `rewritten` those an earlier run left."""
    host = describe_host()
    names = {m.name for m in made}

    def record(fresh: Artifact) -> None:
        for rel in rewritten:  # edge files of an earlier run that this run did not make again
            if rel not in written:
                fresh.remove_file(rel)
        for name in [k for k in fresh.manifest.variants if k.startswith(EDGE_PREFIX)]:
            if name not in names:
                del fresh.manifest.variants[name]
        for m in made:
            fresh.add_variant(m.name, edge_variant(m, parent))
        fresh.manifest.stages.edge = EdgeRecord(
            settings=settings.model_dump(mode="json"),
            inputs={MODEL_FILE: parent},
            parent=parent,
            converter=made[0].converted.converter if made else "onnx2tf",
            variants=[m.name for m in made],
            failed=[m.name for m in made if not m.passed],
            seconds={m.name: m.converted.seconds for m in made},
            host=host,
            fixed_dims=list(plan.fixed),
            attempts=tried,
        )

    return record


def record_refused(
    write: StageWrite, settings: EdgeSpec, parent: str, plan: EdgePlan, refused: NotConverted
) -> str | None:
    """A conversion onnx2tf refused: recorded in the edge stage record, with onnx2tf's last log and the attempts
    kept in reports/ (the scratch directory it was written in goes away); no model file changes. Returns the
    log's path.
    """
    log = refused.log
    kept = None
    write_convert_report(write.scratch, refused.attempts, plan)
    if log is not None and log.is_file():
        shutil.copyfile(log, write.scratch / CONVERT_LOG)
        kept = CONVERT_LOG

    def record(fresh: Artifact) -> None:
        fresh.manifest.stages.edge = EdgeRecord(
            settings={**settings.model_dump(mode="json"), "error": str(refused).splitlines()[0][:500]},
            inputs={MODEL_FILE: parent},
            parent=parent,
            converter="onnx2tf",
            variants=[],
            failed=[f"{EDGE_PREFIX}{p}" for p in plan.precisions],
            fixed_dims=list(plan.fixed),
            attempts=refused.attempts,
        )

    write.commit([*([kept] if kept else []), *CONVERT_REPORTS], record)
    return kept


def edge_variant(m: EdgeMade, parent: str) -> Variant:
    """`m` as its `tflite-<precision>` variant: how to feed it, its verdict, the runtimes it ran on."""
    c = m.converted
    metric = m.report.metric
    name = metric.get("name")
    value = next((v for k, v in metric.items() if k not in ("name", "reference", "difference", "samples")), None)
    runtime = f"ai-edge-litert {_litert_version()}"
    return Variant(
        file=variant_file(m.name),
        precision=c.precision,
        format="tflite",
        stage="edge",
        parent=parent,
        settings={
            "layout": c.input_layout,
            "converter": c.converter,
            **({"int8_io": c.int8_io} if c.int8_io else {}),
            **_scaling_settings(c),
        },
        status="passed" if m.passed else "failed",
        reason="" if m.passed else _reason(m),
        metrics={name: float(value)} if name and isinstance(value, int | float) else {},
        parity=m.report.summary(),
        edge=EdgeIO(
            layout=c.input_layout.upper(),
            inputs=[EdgeTensor(**t) for t in c.inputs],
            outputs=[EdgeTensor(**t) for t in c.outputs],
            names=dict(c.names),
            runtimes={runtime: m.litert, **({m.device.runtime: m.device.ran} if m.device else {})},
        ),
    )


def _scaling_settings(c: Converted) -> dict[str, Any]:
    """The variant's settings: which inputs the caller normalizes, which outputs give boxes divided by [W, H]."""
    taken = [t["name"] for t in c.inputs if t.get("normalize")]
    boxes = {t["name"]: t["boxes_normalized_by"] for t in c.outputs if t.get("boxes_normalized_by")}
    return {**({"normalized_inputs": taken} if taken else {}), **({"boxes_normalized_by": boxes} if boxes else {})}


def _reason(m: EdgeMade) -> str:
    if not m.litert or m.device is None:
        return first_failure(m.report)
    return (f"verified on LiteRT but fails on {m.device.runtime}: {m.device.detail}; "
            "not shipped to devices with that runtime")  # fmt: skip


def _litert_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ai-edge-litert")
    except PackageNotFoundError:
        return "?"
