"""Start uvicorn (httptools + uvloop) with the app, and stop it gracefully.

Everything that would make the server useless is refused before any model loads, so the CLI exits 2
with the fix: bad settings, a port already in use, `--provider cuda` where CUDA cannot run, an
access log that cannot be written. On SIGTERM or Ctrl-C the app's drain (`drain.py`) first keeps
answering for `drain_s` while not ready; then uvicorn stops accepting connections, lets accepted
requests finish (up to `graceful_s`) and runs the app's shutdown, which drains every batcher.
Worker processes (`--workers N`) rebuild the config from PIPE_SERVE_CONFIG through the
`create_app` factory, and share one metrics directory the server makes and removes (metrics.py).
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import shutil
import signal
import socket
import tempfile
from typing import Any

from pipeline.core.errors import InputError, first_line
from pipeline.serve import logs
from pipeline.serve.access_log import STDOUT
from pipeline.serve.config import CONFIG_ENV, ServeConfig
from pipeline.serve.metrics import MULTIPROCESS_ENV
from pipeline.serve.scan import check_paths
from pipeline.serve.variant_choice import check_choices
from pipeline.serve.version_policy import POLICIES

log = logging.getLogger("pipe.serve")
HTTP_PROTOCOL = "pipeline.serve.http_protocol:HeaderDeadlineProtocol"  # httptools with a header deadline
MAX_DRAIN_S = 3600.0


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
    if config.repository.policy not in POLICIES:
        raise InputError(f"--versions {config.repository.policy!r}: choose one of {', '.join(POLICIES)}")
    if not 0 <= http.drain_s <= MAX_DRAIN_S:
        raise InputError(f"--drain-seconds {http.drain_s:g} must be 0-{MAX_DRAIN_S:g} (seconds; 0: stop at once)")
    if not http.read_timeout_s > 0:
        raise InputError(f"--read-timeout {http.read_timeout_s:g} must be > 0 (seconds a request may take to arrive)")
    if http.access_log and http.access_log != STDOUT:
        _check_writable(http.access_log)
    if config.session.provider == "cuda":
        _check_cuda()
    _check_port(http.host, http.port)


def _check_writable(path: str) -> None:
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
    except OSError as exc:
        raise InputError(
            f"--access-log {path}: cannot append to it ({exc.strerror}); give a writable file or -"
        ) from None


# A one-node ONNX model (Identity, float[1]; onnx.helper, opset 13, IR 8): the smallest session that
# shows whether onnxruntime really runs on CUDA here.
_PROBE_MODEL = bytes.fromhex(
    "080812003a370a100a017812017922084964656e746974791201705a0f0a0178120a0a08080112040a020801620f0a0179120a0a"
    "08080112040a02080142040a00100d"
)


def _check_cuda() -> None:
    """`--provider cuda` must mean CUDA: onnxruntime-gpu lists it even where it cannot load and would then
    run every model on CPU (docs/install.md, Serving on a GPU), so a probe session must really get it."""
    import onnxruntime as ort

    from pipeline.runtime.session import CUDA

    available = ort.get_available_providers()
    if CUDA not in available:
        raise InputError(
            f"--provider cuda: this onnxruntime offers only {available}; install onnxruntime-gpu "
            "(make GPU=1) on a machine with a CUDA GPU, or use --provider auto or cpu"
        )
    options = ort.SessionOptions()
    options.log_severity_level = 4  # the probe's own failure is reported below, in one line
    try:
        got = ort.InferenceSession(_PROBE_MODEL, options, providers=[CUDA]).get_providers()
    except Exception as exc:  # onnxruntime's exception types share no base
        got, reason = [], first_line(exc, 200)
    else:
        reason = f"onnxruntime ran a probe model on {got}"
    if CUDA not in got:
        raise InputError(
            f"--provider cuda: CUDA is listed but cannot run here ({reason}); check the GPU driver and the CUDA "
            "and cuDNN libraries onnxruntime-gpu needs, or use --provider auto or cpu"
        )


def _check_port(host: str, port: int) -> None:
    """Bind the address as uvicorn will (SO_REUSEADDR), so a taken port is exit 2 before any model loads."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise InputError(f"--host {host}: cannot resolve it ({exc.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise InputError(
                    f"--port {port}: {host}:{port} is taken (address already in use); stop the process "
                    f"listening there (e.g. `ss -ltnp 'sport = :{port}'`) or choose another --port"
                ) from None
            raise InputError(f"--host {host} --port {port}: cannot listen there ({exc.strerror})") from None


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
    logs.configure(config.http.log_level, config.http.log_format)
    if not _is_loopback(config.http.host):
        log.warning(
            "listening on %s, beyond this machine%s",
            config.http.host,
            "" if config.http.api_key_env else "; no --api-key-env is set, so anyone who can reach it may use it",
        )
    os.environ[CONFIG_ENV] = config.to_env()
    # Every worker writes its metrics here and a scrape sums them; the directory is this server's own.
    metrics_dir = tempfile.mkdtemp(prefix="pipe-serve-metrics-")
    os.environ[MULTIPROCESS_ENV] = metrics_dir
    log.info("metrics: every worker's values are summed through %s (removed on exit)", metrics_dir)
    # uvicorn answers SIGTERM with a graceful shutdown, then raises it again for its default action, which
    # would kill the process before the directory is removed (one left in /tmp per stop): exit instead.
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        _run_uvicorn(uvicorn, config)
    finally:
        signal.signal(signal.SIGTERM, previous)
        shutil.rmtree(metrics_dir, ignore_errors=True)


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # the status a shell reports for a process ended by the signal


def _run_uvicorn(uvicorn: Any, config: ServeConfig) -> None:
    log_config = logs.uvicorn_config(config.http.log_format)
    uvicorn.run(
        "pipeline.serve.app:create_app",
        **({"log_config": log_config} if log_config else {}),  # None: uvicorn's own text lines
        factory=True,
        host=config.http.host,
        port=config.http.port,
        workers=config.http.workers,
        loop="uvloop",
        http=HTTP_PROTOCOL,
        lifespan="on",
        access_log=False,
        # X-Forwarded-* would only rewrite the client address and scheme, which nothing here reads;
        # uvicorn's middleware for them costs every request a coroutine and a header scan.
        proxy_headers=False,
        log_level=config.http.log_level,
        timeout_graceful_shutdown=config.http.graceful_s,
        server_header=False,
    )
