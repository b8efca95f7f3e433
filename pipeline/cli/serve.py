"""`pipe serve`: a model repository (or artifacts) over HTTP."""

from __future__ import annotations

from typing import Any

import click

from pipeline.cli.group import main
from pipeline.cli.params import MAX_THREADS, Number, Whole


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
    help="Per-request limit in seconds (queue + compute; text generation: the wait for a place).",
)
@click.option(
    "--instances", default=1, show_default=True, type=Whole(None, 256), help="Batches of one model computing at once."
)
@click.option(
    "--kv-cache-mb",
    default=512.0,
    show_default=True,
    type=Number(None, 1_048_576),
    help="Text-generation models: the KV cache pool per model version (requests wait for room in it).",
)
@click.option(
    "--max-sequences",
    default=32,
    show_default=True,
    type=Whole(None, 4096),
    help="Text-generation models: sequences decoded together, one onnxruntime call a step.",
)
@click.option(
    "--max-waiting",
    default=64,
    show_default=True,
    type=Whole(None, 1_000_000),
    help="Text-generation models: requests waiting for a place before 503.",
)
@click.option(
    "--prefill-chunk",
    default=256,
    show_default=True,
    type=Whole(None, 1_000_000),
    help="Text-generation models: prompt tokens prefilled per step while streams run (bounds their stall); "
    "up to 8 chunks when the joining prompts outnumber the running streams.",
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
    from pipeline.serve.generation.settings import GenerationSettings
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
            generation=GenerationSettings(
                o["kv_cache_mb"], o["max_sequences"], o["max_waiting"], o["prefill_chunk"], o["timeout"]
            ),
        )
    )
