"""Stop a real `pipe serve` under keep-alive load and count what the clients got (issue 22's drain).

Shared by tests/serve/test_drain.py (one run per case) and bench/bench_drain.py (three runs each).

The clients behave as a load balancer's backends' users do: `CLIENTS` threads each send inference
requests back to back on one keep-alive connection (http.client), and a health checker polls
`/v2/health/ready` every `PROBE_S`. A client opens a new connection only while the checker has the
server in rotation; a response saying `Connection: close` ends its connection. Then the server is
sent SIGTERM (or SIGINT to its process group, as a terminal's Ctrl-C) and the run counts:
- answered: responses received (by status);
- resets: requests written to an open connection that got no response (reset, closed, timed out):
  the failure the drain exists to prevent; the client cannot tell whether the server ran them;
- refused: connections refused (the server was gone before the balancer noticed).
Everything is bounded: `LOAD_S` of load before the signal, `LIMIT_S` in all, 127.0.0.1 only, and
only the server process this run started is signalled.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tests.serve.serve_process import start_server

CLIENTS = 16
PROBE_S = 0.05  # the health checker's period
LOAD_S = 1.5  # load before the signal
LIMIT_S = 60.0  # a run never takes longer than this
BODY = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.0, 1.0, 2.0, 3.0]}]})


@dataclass
class Counts:
    """What the clients of one run got."""

    statuses: Counter = field(default_factory=Counter)  # HTTP status -> responses
    resets: int = 0
    refused: int = 0
    closes: int = 0  # responses that said Connection: close
    out_of_rotation_s: float | None = None  # signal -> the health checker saw "not ready"
    not_ready: str | None = None  # what the health checker saw: an HTTP status ("400") or the error (refused)
    exit_code: int | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def answered(self) -> int:
        return sum(self.statuses.values())

    def line(self) -> str:
        rotation = "never" if self.out_of_rotation_s is None else f"{self.out_of_rotation_s:.2f}s"
        return (
            f"answered {self.answered} {dict(sorted(self.statuses.items()))}, resets {self.resets}, refused "
            f"{self.refused}, Connection: close {self.closes}, out of rotation after {rotation} ({self.not_ready}), "
            f"exit {self.exit_code}"
        )


def _checker(port: int, counts: Counts, in_rotation: threading.Event, done: threading.Event) -> None:
    while not done.is_set():
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/v2/health/ready")
            seen = str(conn.getresponse().status)
            conn.close()
        except (OSError, http.client.HTTPException) as exc:
            seen = type(exc).__name__
        if seen != "200":
            counts.not_ready = seen
            in_rotation.clear()
            return
        time.sleep(PROBE_S)


def _client(port: int, counts: Counts, in_rotation: threading.Event, deadline: float) -> None:
    conn: http.client.HTTPConnection | None = None
    headers = {"content-type": "application/json"}
    while time.monotonic() < deadline:
        if conn is None:
            if not in_rotation.is_set():
                return
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            try:
                conn.connect()
            except ConnectionRefusedError:
                with counts.lock:
                    counts.refused += 1
                return
        try:
            conn.request("POST", "/v2/models/mlp/infer", BODY, headers)
            response = conn.getresponse()
            response.read()
        except (OSError, http.client.HTTPException):  # reset, closed without an answer, timed out
            with counts.lock:
                counts.resets += 1
            conn.close()
            conn = None
            continue
        closing = (response.getheader("connection") or "").lower() == "close"
        with counts.lock:
            counts.statuses[response.status] += 1
            counts.closes += closing
        if closing:
            conn.close()
            conn = None
    if conn is not None:
        conn.close()


def run_once(
    repository: Path, log: Path, workers: int, how: str, drain_s: float | None, extra: tuple[str, ...] = ()
) -> Counts:
    """Serve `repository` with `workers` processes, load it, stop it with `how` ("sigterm" or "ctrl-c"),
    and count. `drain_s` None: the server's default drain (or none, on a server without one)."""
    args = ["--workers", str(workers), "--poll", "0", *extra]
    if drain_s is not None:
        args += ["--drain-seconds", f"{drain_s:g}"]
    server = start_server([repository], log, *args, quick_stop=False, own_group=how == "ctrl-c")
    counts = Counts()
    deadline = time.monotonic() + LIMIT_S
    in_rotation, done = threading.Event(), threading.Event()
    in_rotation.set()
    checker = threading.Thread(target=_checker, args=(server.port, counts, in_rotation, done), daemon=True)
    clients = [
        threading.Thread(target=_client, args=(server.port, counts, in_rotation, deadline), daemon=True)
        for _ in range(CLIENTS)
    ]
    try:
        checker.start()
        for thread in clients:
            thread.start()
        time.sleep(LOAD_S)
        signalled = time.monotonic()
        if how == "ctrl-c":
            os.killpg(server.proc.pid, signal.SIGINT)  # its own group (session): the server and its workers
        else:
            server.proc.send_signal(signal.SIGTERM)
        checker.join(LIMIT_S)
        if not in_rotation.is_set():
            counts.out_of_rotation_s = time.monotonic() - signalled
        for thread in clients:
            thread.join(max(0.0, deadline - time.monotonic()))
        counts.exit_code = server.proc.wait(max(1.0, deadline - time.monotonic()))
    finally:
        done.set()
        server.stop()  # SIGTERM and a bounded wait, then SIGKILL; nothing when it has already exited
    return counts
