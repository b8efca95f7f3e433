"""A real `pipe serve` process for tests: started on a free port, ready when it answers, stopped by SIGTERM.

A module of its own (not conftest.py) so test files import it by a name no other test folder uses.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

READY_TIMEOUT_S = 60
BIND_ATTEMPTS = 3
QUICK_STOP = ("--drain-seconds", "0")  # tests stop their servers at once unless they test the drain


def wait_for(check, timeout: float = 20) -> None:
    """Poll `check` until it is true (a server's hot reload is asynchronous); fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.1)


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


def start_server(
    paths: list[Path],
    log: Path,
    *args: str,
    env: dict[str, str] | None = None,
    probe: str = "ready",
    quick_stop: bool = True,
    own_group: bool = False,
) -> Server:
    """Start `python -m pipeline serve` and wait (bounded) until /v2/health/{probe} answers 200.

    `probe="live"` for a server that serves no model yet (it is live but, rightly, not ready).
    `quick_stop=False` keeps the server's own --drain-seconds; `own_group=True` starts it in a process
    group of its own (a session), so a test can send Ctrl-C's SIGINT to that group as a terminal would.

    The free port is only free when asked for: another process may take it before the server binds,
    so a server that could not bind is started again on a new port (a few times at most).
    """
    for _ in range(BIND_ATTEMPTS - 1):
        try:
            return _start_once(paths, log, args, env, probe, quick_stop, own_group)
        except PortTaken:
            continue
    return _start_once(paths, log, args, env, probe, quick_stop, own_group)


class PortTaken(RuntimeError):
    pass


def _start_once(
    paths: list[Path],
    log: Path,
    args: tuple[str, ...],
    env: dict[str, str] | None,
    probe: str,
    quick_stop: bool,
    own_group: bool,
) -> Server:
    port = free_port()
    command = [sys.executable, "-m", "pipeline", "serve", *map(str, paths), "--port", str(port)]
    command += ["--intra-op-threads", "1", "--inter-op-threads", "1", *(QUICK_STOP if quick_stop else ()), *args]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=own_group,
        )
    server = Server(proc, port, log)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            error = PortTaken if "address already in use" in server.logs() else RuntimeError  # exit 2's line too
            raise error(f"pipe serve exited with {proc.returncode}:\n{server.logs()}")
        # Until this server has bound the port, an answer there would come from whoever took it.
        bound = f"running on {server.url}" in server.logs()
        try:
            if bound and httpx.get(f"{server.url}/v2/health/{probe}", timeout=1).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"pipe serve was not ready within {READY_TIMEOUT_S}s:\n{server.logs()}")


def metric(server: Server, name: str, model: str) -> float:
    """One model's value of a Prometheus series on the server's /metrics."""
    for line in httpx.get(f"{server.url}/metrics").text.splitlines():
        if line.startswith(name + "{") and f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")
