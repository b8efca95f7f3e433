"""Start uvicorn (httptools + uvloop) with the app, and stop it gracefully.

On SIGTERM or Ctrl-C uvicorn stops accepting connections, lets accepted requests finish (up to
`graceful_s`), then runs the app's shutdown, which drains every batcher. Worker processes
(`--workers N`) rebuild the config from PIPE_SERVE_CONFIG through the `create_app` factory.
"""

from __future__ import annotations

import ipaddress
import logging
import os

from pipeline.errors import InputError
from pipeline.serve.config import CONFIG_ENV, ServeConfig
from pipeline.serve.scan import check_paths
from pipeline.serve.variant_choice import check_choices

log = logging.getLogger("pipe.serve")


def _check(config: ServeConfig) -> None:
    """Refuse bad settings before any model loads, so the CLI exits 2 with the reason."""
    check_choices(config.repository.variants)
    check_paths(config.repository.paths, config.repository.variants)
    http, batching = config.http, config.batching
    if not 0 < http.port < 65536:
        raise InputError(f"--port {http.port} is not a TCP port; use 1-65535")
    if http.workers < 1:
        raise InputError(f"--workers {http.workers} must be at least 1")
    if batching.max_batch_size < 1 or batching.max_queue < 1 or batching.instances < 1:
        raise InputError("--max-batch-size, --max-queue and --instances must each be at least 1")
    if batching.max_queue_delay_ms < 0 or batching.timeout_s <= 0:
        raise InputError("--max-queue-delay-ms must be >= 0 and --timeout must be > 0")
    if http.max_body_bytes < 1:
        raise InputError("--max-body-mb must be > 0 (every request body would be refused)")
    if config.session.intra_op_threads < 0 or config.session.inter_op_threads < 0:
        raise InputError("--intra-op-threads and --inter-op-threads must be >= 0 (0: onnxruntime decides)")
    if config.repository.latest is not None and config.repository.latest < 1:
        raise InputError(f"--latest {config.repository.latest} must be at least 1 (omit it to serve all versions)")
    if http.api_key_env and not os.environ.get(http.api_key_env):
        raise InputError(f"--api-key-env {http.api_key_env}: that environment variable is empty or unset")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(config: ServeConfig) -> None:
    """Serve until SIGTERM / Ctrl-C."""
    import uvicorn

    _check(config)
    logging.basicConfig(level=config.http.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not _is_loopback(config.http.host):
        log.warning(
            "listening on %s, beyond this machine%s",
            config.http.host,
            "" if config.http.api_key_env else "; no --api-key-env is set, so anyone who can reach it may use it",
        )
    os.environ[CONFIG_ENV] = config.to_env()
    uvicorn.run(
        "pipeline.serve.app:create_app",
        factory=True,
        host=config.http.host,
        port=config.http.port,
        workers=config.http.workers,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level=config.http.log_level,
        timeout_graceful_shutdown=config.http.graceful_s,
        server_header=False,
    )
