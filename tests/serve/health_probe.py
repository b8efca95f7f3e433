"""A health probe beside an attack: GET /v2/health/live every ~50 ms from a thread, the worst wait for an
answer, and the server's peak resident memory sampled alongside (psutil).

A server whose event loop is held by one request answers no probe until it lets go, so the worst wait
is how long the loop was held. A probe that gets no answer within PROBE_TIMEOUT_S counts as that long.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

import httpx
import psutil

from tests.serve.serve_process import Server

PROBE_EVERY_S = 0.05
PROBE_TIMEOUT_S = 10.0


class HealthProbe:
    """`with HealthProbe(server) as probe: attack()`, then `probe.worst_s`, `probe.peak_rss_mb`."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.worst_s = 0.0  # the longest a probe waited for its answer
        self.answered = 0  # probes answered 200
        self.failed: list[str] = []  # what the others got
        self.peak_rss_mb = 0.0
        self._process = psutil.Process(server.proc.pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HealthProbe:
        self._sample_memory()
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(PROBE_TIMEOUT_S + 5)

    def report(self) -> str:
        return (f"health probe: {self.answered} answered, worst wait {self.worst_s * 1000:.0f} ms, "
                f"{len(self.failed)} failed; server peak RSS {self.peak_rss_mb:.0f} MB")  # fmt: skip

    def _run(self) -> None:
        with httpx.Client(base_url=self.server.url, timeout=PROBE_TIMEOUT_S) as http:
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    answer = http.get("/v2/health/live")
                    if answer.status_code == 200:
                        self.answered += 1
                    else:
                        self.failed.append(f"{answer.status_code} {answer.text[:80]}")
                except httpx.HTTPError as exc:
                    self.failed.append(type(exc).__name__)
                self.worst_s = max(self.worst_s, time.perf_counter() - started)
                self._sample_memory()
                self._stop.wait(PROBE_EVERY_S)

    def _sample_memory(self) -> None:
        try:
            self.peak_rss_mb = max(self.peak_rss_mb, self._process.memory_info().rss / 2**20)
        except psutil.Error:  # the server exited: the test sees that itself
            pass
