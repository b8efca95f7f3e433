"""The `pipe` command line: thin click commands over the stages.

Each command imports its stage inside its body, so `pipe --help` and `pipe serve` never pay for
torch or tensorflow. This module is the one place that turns a PipelineError into a message and an
exit code: 0 ok, 1 a check failed, 2 bad usage or bad input.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from pipeline import __version__
from pipeline.errors import PipelineError


class PipeGroup(click.Group):
    """A click group that reports PipelineErrors as one clear message and the right exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PipelineError as exc:
            click.secho(f"error: {exc}", err=True, fg="red")
            sys.exit(exc.exit_code)


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
    import pathlib

    from pipeline.train.run import train_recipe

    root = train_recipe(
        recipe, resume=resume, epochs=epochs, device=device, nproc=nproc, out_root=pathlib.Path(out_root), quiet=quiet
    )
    if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 alone reports
        click.echo(f"trained {root}")


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON instead of a table.")
@click.option("--no-verify", is_flag=True, help="Skip checking file hashes (inspect a damaged artifact).")
def info(artifact: str, as_json: bool, no_verify: bool) -> None:
    """Show an artifact's manifest (ARTIFACT: artifacts/NAME[/VERSION])."""
    from pipeline.artifact import Artifact, resolve_artifact
    from pipeline.report import manifest_table

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
@click.option("--variant", "variants", multiple=True, help="fp32 (model.onnx) or a manifest variant (opt, int8...), "
              "for every model or as MODEL=VARIANT; repeatable.")  # fmt: skip
@click.option("--poll", default=2.0, show_default=True, help="Seconds between scans for new versions (0: no reload).")
@click.option("--max-batch-size", default=64, show_default=True, help="Rows per onnxruntime run (dynamic batching).")
@click.option("--max-queue-delay-ms", default=1.0, show_default=True, help="How long a batch waits to fill up.")
@click.option("--max-queue", default=256, show_default=True, help="Queued requests per model before 503.")
@click.option("--timeout", default=30.0, show_default=True, help="Per-request limit in seconds (queue + compute).")
@click.option("--instances", default=1, show_default=True, help="Batches of one model computing at once.")
@click.option("--provider", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="onnxruntime provider; auto uses CUDA when onnxruntime-gpu and a GPU are usable.")  # fmt: skip
@click.option("--intra-op-threads", default=0, show_default=True, help="onnxruntime threads per operator (0: auto).")
@click.option("--inter-op-threads", default=0, show_default=True, help="onnxruntime threads across ops (0: auto).")
@click.option("--max-body-mb", default=64.0, show_default=True, help="Largest request body accepted (413 beyond).")
@click.option("--api-key-env", help="Env var holding a token; requests must send 'Authorization: Bearer <token>'.")
@click.option("--graceful-timeout", default=30.0, show_default=True, help="Seconds accepted requests get on SIGTERM.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info")
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
            ),
            session=SessionOptions(o["provider"], o["intra_op_threads"], o["inter_op_threads"]),
            batching=BatchSettings(
                o["max_batch_size"], o["max_queue_delay_ms"], o["max_queue"], o["timeout"], o["instances"]
            ),
        )
    )
