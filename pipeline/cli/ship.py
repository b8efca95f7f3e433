"""Commands that use an artifact: serve it over HTTP, promote a version (labels), predict with one variant, show it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from pipeline.cli.group import main
from pipeline.cli.params import FRACTION, MAX_THREADS, Number, Whole


def _variants(values: tuple[str, ...]) -> dict[str, str]:
    """`--variant int8` (every model) or `--variant digits=int8` (one model) -> {model or '*': variant}."""
    chosen: dict[str, str] = {}
    for value in values:
        model, _, variant = value.rpartition("=")
        if not variant:
            raise click.BadParameter(f"{value!r}: give VARIANT or MODEL=VARIANT, e.g. int8 or digits=int8")
        chosen[model or "*"] = variant
    return chosen


@main.command()
@click.argument("paths", metavar="REPOSITORY|ARTIFACT...", nargs=-1, required=True, type=click.Path())
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind; loopback by default.")
@click.option("--port", default=8000, show_default=True, type=Whole(None, 65535))
@click.option(
    "--workers", default=1, show_default=True, type=Whole(None, 256), help="Server processes (each loads every model)."
)
@click.option(
    "--latest",
    type=Whole(None, 1_000_000),
    help="Serve only the newest N loadable versions of each model (default: all).",
)
@click.option("--versions", "policy", type=click.Choice(["all", "checked", "promoted"]), default="all",
              show_default=True, help="Which versions may be served: all that load, only those whose recorded check "
              "passed, or only those a label names (`pipe promote`).")  # fmt: skip
@click.option("--variant", "variants", multiple=True, help="fp32 (model.onnx), a manifest variant (opt, int8...) or "
              "best (the fastest that passed), for every model or as MODEL=VARIANT; repeatable.")  # fmt: skip
@click.option(
    "--poll",
    default=2.0,
    show_default=True,
    type=Number(0, 3600),
    help="Seconds between scans for new versions (0: no reload).",
)
@click.option(
    "--max-batch-size",
    default=64,
    show_default=True,
    type=Whole(None, 1 << 20),
    help="Rows per onnxruntime run (dynamic batching).",
)
@click.option(
    "--max-queue-delay-ms",
    default=0.0,
    show_default=True,
    type=Number(None, 60_000),
    help="How long a batch waits to fill up.",
)
@click.option(
    "--max-queue",
    default=256,
    show_default=True,
    type=Whole(None, 1_000_000),
    help="Queued requests per model before 503.",
)
@click.option(
    "--timeout",
    default=30.0,
    show_default=True,
    type=Number(None, 3600),
    help="Per-request limit in seconds (queue + compute).",
)
@click.option(
    "--instances", default=1, show_default=True, type=Whole(None, 256), help="Batches of one model computing at once."
)
@click.option("--provider", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="onnxruntime provider; auto uses CUDA when onnxruntime-gpu and a GPU are usable.")  # fmt: skip
@click.option(
    "--intra-op-threads",
    default=0,
    show_default=True,
    type=Whole(None, MAX_THREADS),
    help="onnxruntime threads per operator (0: auto).",
)
@click.option(
    "--inter-op-threads",
    default=0,
    show_default=True,
    type=Whole(None, MAX_THREADS),
    help="onnxruntime threads across ops (0: auto).",
)
@click.option("--spin/--no-spin", default=True, show_default=True, help="Let idle onnxruntime threads busy-wait.")
@click.option(
    "--max-body-mb",
    default=64.0,
    show_default=True,
    type=Number(None, 4096),
    help="Largest request body accepted (413 beyond).",
)
@click.option("--api-key-env", help="Env var holding a token; requests must send 'Authorization: Bearer <token>'.")
@click.option(
    "--graceful-timeout",
    default=30.0,
    show_default=True,
    type=Number(0, 3600),
    help="Seconds requests in flight get to finish once the drain ends.",
)
@click.option("--drain-seconds", default=5.0, show_default=True, type=Number(0, 3600),
              help="On SIGTERM / Ctrl-C: seconds readiness is false while requests are still answered, each "
              "response closing its connection, before the server stops (0: stop at once).")  # fmt: skip
@click.option("--strict-readiness", is_flag=True,
              help="Ready only when every model found serves a version, as Triton's default: a model whose every "
              "version was refused or held back keeps the server not ready (default: ready while one version "
              "serves; each model's /ready answers for itself either way).")  # fmt: skip
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info")
@click.option("--access-log", metavar="PATH|-", help="Append one JSON line per request to PATH (- for stdout).")
@click.option("--log-format", type=click.Choice(["text", "json"]), default=None,
              help="The server's own log lines: text, or one JSON object per line. [default: json with "
              "--access-log, else text]")  # fmt: skip
@click.option("--read-timeout", default=30.0, show_default=True, type=Number(None, 3600),
              help="Seconds a request's headers, then its body, may take to arrive (408 beyond).")  # fmt: skip
def serve(paths: tuple[str, ...], **options: Any) -> None:
    """Serve artifacts over HTTP: KServe V2 (binary tensors too), TF Serving REST, /metrics."""
    from pathlib import Path

    from pipeline.serve.batching import BatchSettings
    from pipeline.serve.config import HTTPSettings, ServeConfig
    from pipeline.serve.repository import RepositorySettings
    from pipeline.serve.server import run
    from pipeline.serve.session import SessionOptions

    o = options
    run(
        ServeConfig(
            repository=RepositorySettings(
                tuple(Path(p) for p in paths), o["latest"], _variants(o["variants"]), o["poll"], o["policy"]
            ),
            http=HTTPSettings(
                host=o["host"],
                port=o["port"],
                workers=o["workers"],
                max_body_bytes=int(o["max_body_mb"] * 1024 * 1024),
                api_key_env=o["api_key_env"],
                graceful_s=o["graceful_timeout"],
                drain_s=o["drain_seconds"],
                log_level=o["log_level"],
                access_log=o["access_log"],
                log_format=o["log_format"] or ("json" if o["access_log"] else "text"),
                read_timeout_s=o["read_timeout"],
                strict_readiness=o["strict_readiness"],
            ),
            session=SessionOptions(o["provider"], o["intra_op_threads"], o["inter_op_threads"], o["spin"]),
            batching=BatchSettings(
                o["max_batch_size"], o["max_queue_delay_ms"], o["max_queue"], o["timeout"], o["instances"]
            ),
        )
    )


@main.command()
@click.argument("artifact", metavar="ARTIFACT_VERSION", type=click.Path())
@click.option("--label", default="stable", show_default=True, help="The label to point at this version (stable, "
              "canary ...); `stable` also takes the requests that name no version.")  # fmt: skip
@click.option("--force", is_flag=True, help="Promote a version whose recorded check failed.")
def promote(artifact: str, label: str, force: bool) -> None:
    """Point a version label (artifacts/NAME/labels.json) at ARTIFACT_VERSION (artifacts/NAME/N).

    A running `pipe serve` picks the label up on its next scan: `/v1/models/NAME/labels/LABEL` and
    `/v2/models/NAME/labels/LABEL/...` reach the version, and with `--versions promoted` only labelled
    versions are served.
    """
    from pipeline.artifact.directory import Artifact
    from pipeline.artifact.labels import check_label, write_label
    from pipeline.artifact.manifest import MANIFEST_NAME
    from pipeline.core.errors import InputError

    check_label(label)
    path = Path(artifact)
    if not (path / MANIFEST_NAME).is_file():
        raise InputError(f"{artifact}: no {MANIFEST_NAME} in it; give one version directory, artifacts/NAME/N")
    loaded = Artifact.load(path, verify=True)
    manifest, check = loaded.manifest, loaded.manifest.stages.check
    if check is not None and not check.passed and not force:
        raise InputError(
            f"{artifact}: its recorded check failed ({'; '.join(check.failures[:3]) or 'see its check report'}); "
            "fix the model, or pass --force to promote it anyway"
        )
    previous = write_label(loaded.root.parent, label, manifest.version)
    was = "" if previous is None else " (unchanged)" if previous == manifest.version else f" (was v{previous})"
    status = "no check record" if check is None else "check passed" if check.passed else "check FAILED"
    click.echo(f"{manifest.name}: {label} -> v{manifest.version}{was}; {status}")


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--input", "input_file", default=None, type=click.Path(),
              help="FILE.npz (one array per input name), FILE.json (an object keyed by input name, or a list for "
              "one input), a PNG/JPEG for a model with one image input, or for a model trained on a table "
                   "FILE.json of rows keyed by column name or FILE.csv with a header row.")  # fmt: skip
@click.option("--text", "texts", multiple=True, help="A text for a model that carries its tokenizer, one row each "
              "(repeatable); instead of --input.")  # fmt: skip
@click.option("--variant", default="fp32", show_default=True, help="The variant to run: fp32 (model.onnx), opt, "
              "int8, tflite-fp16 ... (pipe info lists them).")  # fmt: skip
@click.option("--top-k", default=5, show_default=True, type=Whole(1, 100_000), help="Classes shown per sample.")
@click.option("--allow-failed", is_flag=True, help="Run a failed or stale variant anyway (a note says why it is not "
              "usable).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print JSON: top_k or detections per sample and the outputs.")
@click.option("--confidence", type=FRACTION, default=None, help="Detection: keep boxes scoring above this. [recorded]")
@click.option("--iou", type=FRACTION, default=None, help="Detection: NMS IoU above which a box is dropped. [recorded]")
@click.option("--max-detections", type=Whole(1, 100_000), default=None, help="Detection: boxes kept per sample. "
              "[recorded]")  # fmt: skip
def predict(
    artifact: str,
    input_file: str | None,
    texts: tuple[str, ...],
    variant: str,
    top_k: int,
    allow_failed: bool,
    as_json: bool,
    confidence: float | None,
    iou: float | None,
    max_detections: int | None,
) -> None:
    """Run one variant of ARTIFACT on an input file or on texts, locally, for a quick look (top-k labels for
    classifiers, boxes for detectors)."""
    from pipeline.predict.command import predict_file

    detection = {"confidence": confidence, "iou": iou, "max_detections": max_detections}
    result = predict_file(artifact, input_file, variant, allow_failed, detection, list(texts))
    for note in result.notes:
        click.secho(f"note: {note}", err=True, fg="yellow")
    click.echo(result.to_json(top_k) if as_json else result.text(top_k))


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON instead of a table.")
@click.option("--no-verify", is_flag=True, help="Skip checking file hashes (inspect a damaged artifact).")
@click.option(
    "--trainable", is_flag=True, help="List model.onnx's parameters, the names `pipe train --from --trainable` takes."
)
def info(artifact: str, as_json: bool, no_verify: bool, trainable: bool) -> None:
    """Show a version's manifest (artifacts/NAME/VERSION), or every version of a model (artifacts/NAME).

    A model directory lists each version with its stages and status; --json prints its newest
    version's manifest.
    """
    if trainable:
        from pipeline.cli.info import trainable_table

        click.echo(trainable_table(artifact, verify=not no_verify))
        return
    from pipeline.artifact.directory import Artifact, is_version_name, resolve_artifact
    from pipeline.artifact.manifest import MANIFEST_NAME
    from pipeline.cli.info import describe_path, manifest_table
    from pipeline.core.errors import ArtifactError

    path = Path(artifact)
    is_version = (path / MANIFEST_NAME).is_file() or is_version_name(path.name) or path.name.isdigit()
    if not is_version and (not as_json or path.is_file()):  # a bare .onnx is pointed at pipe import
        overview, damaged = describe_path(path)
        click.echo(overview)
        if damaged:
            raise ArtifactError(f"{len(damaged)} version(s) did not load: {', '.join(damaged)} (reasons above)")
        return
    loaded = Artifact.load(resolve_artifact(artifact), verify=not no_verify)
    if as_json:
        click.echo(json.dumps(loaded.manifest.to_dict(), indent=2))
    else:
        click.echo(manifest_table(loaded))
