"""The `pipe` command line: thin click commands over the stages.

Each command imports its stage inside its body, so `pipe --help` and `pipe serve` never pay for
torch or tensorflow. This module is the one place that turns a PipelineError into a message and an
exit code: 0 ok, 1 a check failed, 2 bad usage or bad input, 3 an internal error (any other exception:
one line, the full trace written to a file).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from pipeline import __version__
from pipeline.errors import PipelineError

INTERNAL_ERROR = 3  # exit code of an exception pipe did not raise on purpose (a bug, or one not yet handled)


class PipeGroup(click.Group):
    """A click group that reports PipelineErrors as one clear message and the right exit code.

    Any other exception is ours to fix, not the user's to read: one line naming it and the file
    holding its full trace, exit 3. Click's own exceptions (usage errors, --help) and
    KeyboardInterrupt pass through as click handles them.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PipelineError as exc:
            click.secho(f"error: {exc}", err=True, fg="red")
            sys.exit(exc.exit_code)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            where = _write_trace()
            message = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
            click.secho(
                f"error: internal error: {type(exc).__name__}: {message} (full trace: {where})", err=True, fg="red"
            )
            sys.exit(INTERNAL_ERROR)


def _write_trace() -> str:
    """The current exception's trace, written to a new file under the temp directory; its path, or why not."""
    import tempfile
    import traceback

    try:
        handle, path = tempfile.mkstemp(prefix="pipe-trace-", suffix=".txt")
        with open(handle, "w", encoding="utf-8") as out:
            out.write(f"pipe {__version__}: {' '.join(sys.argv)}\n\n{traceback.format_exc()}")
    except OSError as exc:
        return f"not written: {exc}"
    return path


@click.group(cls=PipeGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pipe")
def main() -> None:
    """pipe: train a model, export it once to ONNX, verify, optimize, serve and ship it."""


@main.command()
@click.argument("recipe", type=click.Path())
@click.option("--resume", is_flag=True, help="Continue the newest unfinished run of this recipe from its checkpoint.")
@click.option("--epochs", type=int, help="Override train.epochs.")
@click.option(
    "--device", type=click.Choice(["auto", "cpu", "cuda"]), help="Override train.device (auto: CUDA if present)."
)
@click.option(
    "--nproc", default=1, show_default=True, type=int, help="Processes on this machine (torchrun; DDP or FSDP)."
)
@click.option("--out", "out_root", default="artifacts", show_default=True, type=click.Path(), help="Model repository.")
@click.option("--quiet", is_flag=True, help="No progress display (metrics still go to reports/).")
def train(
    recipe: str, resume: bool, epochs: int | None, device: str | None, nproc: int, out_root: str, quiet: bool
) -> None:
    """Train RECIPE (models/NAME.yaml) into a new artifact version: artifacts/NAME/VERSION.

    Also runs under your own torchrun (e.g. `torchrun --nnodes 2 ... -m pipeline train RECIPE`).
    """
    import os

    from pipeline.train.observe import TENSORBOARD_DIR
    from pipeline.train.run import train_recipe

    root = train_recipe(
        recipe, resume=resume, epochs=epochs, device=device, nproc=nproc, out_root=Path(out_root), quiet=quiet
    )
    if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 alone reports
        click.echo(f"trained {root}")
        if not quiet:  # --quiet prints the version's path alone, for scripts
            click.echo(f"curves: tensorboard --logdir {root.parent}  (this run: {root / TENSORBOARD_DIR})")


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON instead of a table.")
@click.option("--no-verify", is_flag=True, help="Skip checking file hashes (inspect a damaged artifact).")
def info(artifact: str, as_json: bool, no_verify: bool) -> None:
    """Show a version's manifest (artifacts/NAME/VERSION), or every version of a model (artifacts/NAME).

    A model directory lists each version with its stages and status; --json prints its newest
    version's manifest.
    """
    from pipeline.artifact import Artifact, is_version_name, resolve_artifact
    from pipeline.errors import ArtifactError
    from pipeline.info import describe_path, manifest_table
    from pipeline.manifest import MANIFEST_NAME

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
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--workers", default=1, show_default=True, type=int, help="Server processes (each loads every model).")
@click.option("--latest", type=int, help="Serve only the newest N loadable versions of each model (default: all).")
@click.option("--variant", "variants", multiple=True, help="fp32 (model.onnx), a manifest variant (opt, int8...) or "
              "best (the fastest that passed), for every model or as MODEL=VARIANT; repeatable.")  # fmt: skip
@click.option("--poll", default=2.0, show_default=True, help="Seconds between scans for new versions (0: no reload).")
@click.option("--max-batch-size", default=64, show_default=True, help="Rows per onnxruntime run (dynamic batching).")
@click.option("--max-queue-delay-ms", default=0.0, show_default=True, help="How long a batch waits to fill up.")
@click.option("--max-queue", default=256, show_default=True, help="Queued requests per model before 503.")
@click.option("--timeout", default=30.0, show_default=True, help="Per-request limit in seconds (queue + compute).")
@click.option("--instances", default=1, show_default=True, help="Batches of one model computing at once.")
@click.option("--provider", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="onnxruntime provider; auto uses CUDA when onnxruntime-gpu and a GPU are usable.")  # fmt: skip
@click.option("--intra-op-threads", default=0, show_default=True, help="onnxruntime threads per operator (0: auto).")
@click.option("--inter-op-threads", default=0, show_default=True, help="onnxruntime threads across ops (0: auto).")
@click.option("--spin/--no-spin", default=True, show_default=True, help="Let idle onnxruntime threads busy-wait.")
@click.option("--max-body-mb", default=64.0, show_default=True, help="Largest request body accepted (413 beyond).")
@click.option("--api-key-env", help="Env var holding a token; requests must send 'Authorization: Bearer <token>'.")
@click.option("--graceful-timeout", default=30.0, show_default=True, help="Seconds accepted requests get on SIGTERM.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info")
@click.option("--access-log", metavar="PATH|-", help="Append one JSON line per request to PATH (- for stdout).")
@click.option("--read-timeout", default=30.0, show_default=True,
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
                tuple(Path(p) for p in paths), o["latest"], _variants(o["variants"]), o["poll"]
            ),
            http=HTTPSettings(
                host=o["host"],
                port=o["port"],
                workers=o["workers"],
                max_body_bytes=int(o["max_body_mb"] * 1024 * 1024),
                api_key_env=o["api_key_env"],
                graceful_s=o["graceful_timeout"],
                log_level=o["log_level"],
                access_log=o["access_log"],
                read_timeout_s=o["read_timeout"],
            ),
            session=SessionOptions(o["provider"], o["intra_op_threads"], o["inter_op_threads"], o["spin"]),
            batching=BatchSettings(
                o["max_batch_size"], o["max_queue_delay_ms"], o["max_queue"], o["timeout"], o["instances"]
            ),
        )
    )


@main.command()
@click.argument("artifact", type=click.Path())
@click.option(
    "--target",
    type=click.Choice(["server", "edge", "triton"]),
    default="server",
    show_default=True,
    help="server: model.onnx in the artifact, parity-gated against torch; edge: TFLite fp32/fp16/int8 from "
    "model.onnx, verified on LiteRT; triton: a Triton model repository from model.onnx (needs --out).",
)
@click.option("--precision", "precisions", multiple=True, type=click.Choice(["fp32", "fp16", "int8"]),
              help="Edge: TFLite models to make (repeatable) [default: recipe edge.precisions].")  # fmt: skip
@click.option("--layout", type=click.Choice(["nhwc", "nchw"], case_sensitive=False), default=None,
              help="Edge: image input layout, NHWC for devices or the server's NCHW [default: recipe].")  # fmt: skip
@click.option("--opset", type=click.IntRange(min=7), default=None, help="ONNX opset [default: recipe export.opset]")
@click.option(
    "--exporter",
    type=click.Choice(["dynamo", "torchscript"]),
    default=None,
    help="dynamo falls back to torchscript and logs why [default: the recipe's export.dynamo]",
)
@click.option("--atol", type=float, default=None, help="Parity: max abs difference [default: recipe export.atol]")
@click.option("--rtol", type=float, default=None, help="Parity: relative difference [default: recipe export.rtol]")
@click.option("--recipe", type=click.Path(), default=None,
              help="Recipe to read export settings from [default: the one it was trained from].")  # fmt: skip
@click.option("--out", type=click.Path(), default=None, help="Triton: the model repository directory to write into.")
@click.option("--max-batch-size", type=click.IntRange(min=1), default=64, show_default=True, help="Triton batching.")
@click.option("--instance-kind", type=click.Choice(["cpu", "gpu"]), default=None,
              help="Triton: pin the model to CPU or GPU instances [default: none written; Triton uses its GPUs "
              "when it has them, else the CPU].")  # fmt: skip
def export(
    artifact: str,
    target: str,
    precisions: tuple[str, ...],
    layout: str | None,
    opset: int | None,
    exporter: str | None,
    atol: float | None,
    rtol: float | None,
    recipe: str | None,
    out: str | None,
    max_batch_size: int,
    instance_kind: str | None,
) -> None:
    """Export a trained ARTIFACT to ONNX through the parity gate (exit 1 when it drifts).

    Settings come from the recipe's export section as it is now; --opset, --exporter, --atol and
    --rtol override it for this run.
    """
    if target == "edge":
        from pipeline.edge.stage import edge_artifact

        overrides = {"precisions": list(precisions) or None, "layout": layout and layout.lower()}
        outcome = edge_artifact(artifact, overrides, Path(recipe) if recipe else None, say=click.echo)
        for note in outcome.notes:
            click.secho(f"note: {note}", err=True, fg="yellow")
        for m in outcome.made:
            click.echo(f"  {m.name:<13} passed  {m.converted.path.name}  ({m.converted.seconds:.1f} s to convert)")
        return
    if target == "triton":
        from pipeline.artifact import Artifact, resolve_artifact
        from pipeline.errors import InputError
        from pipeline.export.triton import write_repository

        if out is None:
            raise InputError("--target triton writes a model repository: pass --out DIR (e.g. --out triton-models)")
        model_dir = write_repository(
            Artifact.load(resolve_artifact(artifact)), Path(out), max_batch_size, instance_kind
        )
        click.echo(f"Triton model repository: {model_dir} (config.pbtxt + version directory)")
        return
    from pipeline.export.stage import Overrides, export_artifact
    from pipeline.variants import MODEL_FILE

    overrides = Overrides(opset=opset, exporter=exporter, atol=atol, rtol=rtol)
    outcome = export_artifact(artifact, overrides, Path(recipe) if recipe else None)
    for note in outcome.notes:
        click.secho(f"note: {note}", err=True, fg="yellow")
    result = outcome.result
    via = result.exporter + (f" (fallback: {result.fallback_reason})" if result.fallback_reason else "")
    click.echo(outcome.report.table())
    click.echo(f"exported {outcome.artifact.root / MODEL_FILE}: opset {result.opset}, exporter {via}")


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--quantize", "quantize", multiple=True, type=click.Choice(["dynamic", "static", "fp16", "auto"]),
              help="Variants to make (repeatable) [default: the recipe's optimize.quantize].")  # fmt: skip
@click.option("--graph", type=click.Choice(["none", "basic", "extended"]), default=None,
              help="onnxruntime offline level for variants/model.opt.onnx [default: recipe].")  # fmt: skip
@click.option("--max-accuracy-drop", type=float, default=None, help="Budget: task-metric drop allowed (its units).")
@click.option("--min-cosine", type=float, default=None, help="Budget for embeddings: minimum cosine similarity.")
@click.option("--per-channel/--per-tensor", default=None, help="int8 weight scales [default: recipe].")
@click.option("--calibration", type=click.Choice(["minmax", "entropy", "percentile"]), default=None,
              help="Static int8: how activation ranges are set [default: recipe].")  # fmt: skip
@click.option("--reduce-range/--full-range", default=None, help="int8 weights in 7 bits (CPUs without VNNI).")
@click.option("--activation-type", type=click.Choice(["uint8", "int8"]), default=None, help="Static int8 activations.")
@click.option("--calibration-samples", type=int, default=None, help="Real training samples static int8 calibrates on.")
@click.option("--slim/--no-slim", default=None, help="onnxslim after onnxruntime's passes for the opt variant.")
@click.option("--max-exclusions", type=int, default=None, help="auto: nodes the search may leave in fp32.")
@click.option("--threads", type=int, default=None, help="Intra-op threads the variants are timed with.")
@click.option("--strict/--no-strict", default=None, help="Exit 1 when a variant misses its budget [default: recipe].")
@click.option("--recipe", type=click.Path(), default=None, help="Recipe to read optimize settings from.")
def optimize(artifact: str, quantize: tuple[str, ...], recipe: str | None, **options: Any) -> None:
    """Graph-optimize and quantize ARTIFACT's model.onnx into verified variants (variants/, reports/optimize.md).

    Every variant is judged against model.onnx (the task metric's drop, or agreement, cosine or
    relative error without labels) and timed beside it. One that misses its budget is recorded as
    failed and never served by default; --strict also makes the command exit 1.
    """
    from pipeline.optimize.stage import optimize_artifact

    overrides = {**options, "quantize": list(quantize) or None}
    outcome = optimize_artifact(artifact, overrides, Path(recipe) if recipe else None, say=click.echo)
    for note in outcome.notes:
        click.secho(f"note: {note}", err=True, fg="yellow")
    for m in outcome.made:
        status = "passed" if m.verdict.passed else "FAILED (not served)"
        click.echo(f"  {m.name:<13} {status:<20} {m.verdict.detail}")
    click.echo(f"report: {outcome.artifact.root / 'reports' / 'optimize.md'}")


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--input", "input_file", required=True, type=click.Path(),
              help="FILE.npz (one array per input name), FILE.json (an object keyed by input name, or a list for "
              "one input) or a PNG/JPEG for a model with one image input.")  # fmt: skip
@click.option("--variant", default="fp32", show_default=True, help="The variant to run: fp32 (model.onnx), opt, "
              "int8, tflite-fp16 ... (pipe info lists them).")  # fmt: skip
@click.option("--top-k", default=5, show_default=True, type=click.IntRange(min=1), help="Classes shown per sample.")
@click.option("--allow-failed", is_flag=True, help="Run a failed or stale variant anyway (a note says why it is not "
              "usable).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print JSON: top_k per sample and every output in full.")
def predict(artifact: str, input_file: str, variant: str, top_k: int, allow_failed: bool, as_json: bool) -> None:
    """Run one variant of ARTIFACT on an input file, locally, for a quick look (top-k labels for classifiers)."""
    from pipeline.predict.run import predict_file

    result = predict_file(artifact, input_file, variant, allow_failed)
    for note in result.notes:
        click.secho(f"note: {note}", err=True, fg="yellow")
    click.echo(result.to_json(top_k) if as_json else result.text(top_k))


@main.command("import")
@click.argument("model", type=click.Path())
@click.option("--name", required=True, help="Artifact name: artifacts/NAME/<next version>/.")
@click.option("--eval-data", type=click.Path(), default=None, help="NPZ: one array per input name, optional 'target'.")
@click.option("--labels", default=None, help="Class names, comma separated: --labels cat,dog.")
@click.option("--labels-file", type=click.Path(), default=None, help="Class names, one per line.")
@click.option(
    "--task",
    type=click.Choice(["classification", "regression", "embedding"]),
    default="classification",
    show_default=True,
)
@click.option("--repository", type=click.Path(), default="artifacts", show_default=True, help="Where artifacts live.")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME:D0,D1,...",
              help="Dims of input NAME (repeatable): an int fixes one, a name names one, ? or -1 leaves it free, "
              "e.g. x:1,3,48,192 for a model declaring [-1, 3, ?, ?]. See docs/export.md.")  # fmt: skip
@click.option(
    "--image-preprocessing",
    default=None,
    help='How pictures feed the image input, as JSON: \'{"mode": "RGB", "size": [224, 224], "resize": "bilinear", '
    '"scale": 0.00392156862745098, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}\' '
    "(mean/std: applied outside the model; also layout NCHW|NHWC, input NAME). See docs/artifact.md.",
)
def import_cmd(
    model: str,
    name: str,
    eval_data: str | None,
    labels: str | None,
    labels_file: str | None,
    task: str,
    repository: str,
    input_shapes: tuple[str, ...],
    image_preprocessing: str | None,
) -> None:
    """Make an artifact from an ONNX MODEL produced elsewhere (JAX, TensorFlow, Paddle, ...)."""
    from pipeline.export.importer import import_onnx, read_labels
    from pipeline.export.shapes import parse_input_shapes
    from pipeline.golden import load_golden

    shapes = parse_input_shapes(input_shapes)
    names = read_labels(labels, Path(labels_file) if labels_file else None)
    evaluation = Path(eval_data) if eval_data else None
    artifact = import_onnx(
        Path(model), name, Path(repository), evaluation, names, task, image_preprocessing, input_shapes=shapes
    )
    golden = artifact.manifest.stages.import_.golden if artifact.manifest.stages.import_ else "?"
    click.echo(f"imported {model} -> {artifact.root} (golden outputs from {golden} inputs)")
    arrays = load_golden(artifact).inputs
    for spec in artifact.manifest.inputs:  # which sizes the free dims were run at
        shape = ", ".join(str(d) for d in spec.shape)
        click.echo(f"  golden {spec.name}: {list(arrays[spec.name].shape)} for [{shape}]")


@main.command()
@click.argument("candidate", type=click.Path())
@click.option("--baseline", type=click.Path(), default=None,
              help="An artifact (artifacts/NAME[/VERSION]) or a .json written by --write-baseline.")  # fmt: skip
@click.option("--write-baseline", type=click.Path(), default=None, help="Write CANDIDATE's summary to this .json.")
@click.option("--max-accuracy-drop", type=float, default=None, help="Budget: metric drop allowed [default: recipe].")
@click.option("--max-latency-increase", type=float, default=None, help="Budget: 0.10 = 10% slower [default: recipe].")
@click.option("--max-size-increase", type=float, default=None, help="Budget: 0.10 = 10% larger [default: recipe].")
@click.option("--latency-seconds", type=click.FloatRange(min=0, min_open=True), default=2.0, show_default=True,
              help="Time spent timing both models side by side.")  # fmt: skip
@click.option("--junit", type=click.Path(), default=None, help="Write JUnit XML (one testcase per check).")
@click.option("--markdown", type=click.Path(), default=None, help="Write Markdown (e.g. $GITHUB_STEP_SUMMARY).")
@click.option("--json", "json_file", type=click.Path(), default=None, help="Write every check as JSON.")
def check(
    candidate: str,
    baseline: str | None,
    write_baseline: str | None,
    latency_seconds: float,
    junit: str | None,
    markdown: str | None,
    json_file: str | None,
    **budgets: float | None,
) -> None:
    """Check CANDIDATE against a baseline: metrics, variants, I/O signature, size, latency (exit 1: a regression)."""
    from pipeline.errors import InputError

    if (baseline is None) == (write_baseline is None):
        raise InputError("pass --baseline BASELINE to check CANDIDATE, or --write-baseline FILE to write one, not both")
    if write_baseline is not None:
        from pipeline.artifact import Artifact, resolve_artifact
        from pipeline.check.baseline import write_baseline as write

        loaded = Artifact.load(resolve_artifact(candidate))
        try:
            written = write(loaded, Path(write_baseline))
        except OSError as exc:
            raise InputError(f"--write-baseline {write_baseline}: cannot write it ({exc.strerror or exc})") from None
        click.echo(f"baseline: {written.name} v{written.version} -> {write_baseline}")
        return
    from pipeline.check.reports import to_table, write_reports
    from pipeline.check.run import check_candidate

    outcome = check_candidate(candidate, baseline, budgets, latency_seconds)
    for note in outcome.notes:
        click.secho(f"note: {note}", err=True, fg="yellow")
    click.echo(to_table(outcome))
    paths = [Path(p) if p else None for p in (junit, markdown, json_file)]
    for path in write_reports(outcome, *paths):
        click.echo(f"report: {path}")
    outcome.raise_on_failure()


@main.command()
@click.argument("artifact", type=click.Path())
def report(artifact: str) -> None:
    """Write ARTIFACT's model card (reports/model-card.md) and training curves (reports/training-curves.png)."""
    from pipeline.report.run import report_artifact

    outcome = report_artifact(Path(artifact), say=click.echo)
    for note in outcome.notes:
        click.secho(f"note: {note}", err=True, fg="yellow")
    click.echo(f"card: {outcome.card}")
    click.echo(f"curves: {outcome.curves or 'none (see the note)'}")


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--seconds", type=float, default=1.0, show_default=True, help="Timed runs per row and batch.")
@click.option("--threads", type=int, default=1, show_default=True, help="Threads every runtime runs with.")
@click.option("--json", "json_copy", type=click.Path(), default=None, help="Also write the JSON report to this file.")
@click.option("--no-plot", is_flag=True, help="Write no reports/benchmark.png.")
def benchmark(artifact: str, seconds: float, threads: int, json_copy: str | None, no_plot: bool) -> None:
    """Time every format of ARTIFACT side by side: torch, ONNX and its variants, TFLite (size, metric, latency)."""
    from pipeline.artifact import resolve_artifact
    from pipeline.benchmark.run import benchmark_artifact
    from pipeline.benchmark.table import render
    from pipeline.errors import InputError

    outcome = benchmark_artifact(
        resolve_artifact(artifact), seconds=seconds, threads=threads, say=click.echo, plot=not no_plot
    )
    click.echo(render(outcome))
    for note in outcome.notes:
        click.secho(f"note: {note}", err=True, fg="yellow")
    if json_copy is not None:
        try:
            Path(json_copy).write_text(outcome.report.read_text())
        except OSError as exc:
            raise InputError(
                f"--json {json_copy}: cannot write it ({exc.strerror}); the report is in {outcome.report}"
            ) from None
    for path in (outcome.report, outcome.plot, json_copy):
        if path is not None:
            click.echo(f"report: {path}")


@main.command("run")
@click.argument("recipe", type=click.Path())
@click.option("--out", "out_root", default="artifacts", show_default=True, type=click.Path(), help="Model repository.")
@click.option("--force", is_flag=True, help="Run every stage even when its output is up to date.")
def run_cmd(recipe: str, out_root: str, force: bool) -> None:
    """Run every stage for RECIPE (train, export, optimize, edge), skipping those already up to date."""
    from pipeline.run import run_recipe

    run_recipe(recipe, out_root=Path(out_root), force=force, echo=click.echo)
