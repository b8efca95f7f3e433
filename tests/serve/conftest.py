"""Fixtures for the server tests: a repository of real artifacts and real `pipe serve` processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from serve_models import embed, mlp, strings, two_in_two_out, write_artifact

READY_TIMEOUT_S = 60
BIND_ATTEMPTS = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """A running `pipe serve` process on 127.0.0.1."""

    proc: subprocess.Popen
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def logs(self) -> str:
        return self.log.read_text()

    def stop(self, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


def start_server(paths: list[Path], log: Path, *args: str, env: dict[str, str] | None = None) -> Server:
    """Start `python -m pipeline serve` and wait (bounded) until /v2/health/ready answers 200.

    The free port is only free when asked for: another process may take it before the server binds,
    so a server that could not bind is started again on a new port (a few times at most).
    """
    for _ in range(BIND_ATTEMPTS - 1):
        try:
            return _start_once(paths, log, args, env)
        except PortTaken:
            continue
    return _start_once(paths, log, args, env)


class PortTaken(RuntimeError):
    pass


def _start_once(paths: list[Path], log: Path, args: tuple[str, ...], env: dict[str, str] | None) -> Server:
    port = free_port()
    command = [sys.executable, "-m", "pipeline", "serve", *map(str, paths), "--port", str(port)]
    command += ["--intra-op-threads", "1", "--inter-op-threads", "1", *args]
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    server = Server(proc, port, log)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            error = PortTaken if "address already in use" in server.logs() else RuntimeError
            raise error(f"pipe serve exited with {proc.returncode}:\n{server.logs()}")
        # Until this server has bound the port, an answer there would come from whoever took it.
        bound = f"running on {server.url}" in server.logs()
        try:
            if bound and httpx.get(f"{server.url}/v2/health/ready", timeout=1).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"pipe serve was not ready within {READY_TIMEOUT_S}s:\n{server.logs()}")


@pytest.fixture(scope="session")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """artifacts/: mlp v1 and v2 (different weights, v2 with an `opt` variant), pair, embed, strings."""
    repo = tmp_path_factory.mktemp("serve") / "artifacts"
    write_artifact(repo, "mlp", 1, mlp([4, 8, 3], seed=1))
    write_artifact(repo, "mlp", 2, mlp([4, 8, 3], seed=2), variants={"opt": mlp([4, 8, 3], seed=2, scale=2.0)})
    write_artifact(repo, "pair", 1, two_in_two_out())
    write_artifact(repo, "embed", 1, embed())
    write_artifact(repo, "strings", 1, strings())
    return repo


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One shared server for the protocol tests (hot reload off: the repository does not change)."""
    running = start_server([repository], tmp_path_factory.mktemp("log") / "serve.log", "--poll", "0")
    yield running
    running.stop()
