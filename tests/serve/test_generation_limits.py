"""Text generation's limits over HTTP, on a real `pipe serve` with 8 places (`--max-sequences 8`), one
waiting slot (`--max-waiting 1`) and a short `--timeout`: a full queue and a wait past the timeout are
503s with Retry-After (a stream's before its headers), and a client that leaves an unstreamed request
cancels its sequence. The tiny random Llama is the import test_generation.py uses, cached across runs
(tests/lm/imported_lm.py)."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.lm.imported_lm import NAME, imported_llama
from tests.serve.serve_process import Server, metric, start_server, wait_for

pytestmark = pytest.mark.slow  # one import of a tiny Llama (about 20 s of CPU) when the test model cache lacks it

CONTEXT = 512  # test_generation.py's: the same cached import
PLACES = 8  # --max-sequences
LONG = 500  # new tokens of each stream holding a place: 8 of them take about 1 s here, and are cut short
WAIT_S = 0.1  # --timeout: the longest a request waits for a place


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("lm-limits")
    _, repository = imported_llama(base, CONTEXT)
    running = start_server([repository], base / "serve.log", "--poll", "0", "--max-sequences", str(PLACES),
                           "--max-waiting", "1", "--timeout", str(WAIT_S),
                           "--access-log", str(base / "access.jsonl"))  # fmt: skip
    yield running
    running.stop()


def _metric(server: Server, name: str) -> float:
    return metric(server, name, NAME)


def _idle(server: Server) -> bool:
    names = ("pipe_sequences_running", "pipe_sequences_waiting", "pipe_kv_cache_usage_ratio")
    return all(_metric(server, n) == 0 for n in names)


def _post(server: Server, path: str, body: dict[str, Any]) -> socket.socket:
    """A request sent on a raw connection left open: the test closes it as a client that gives up would."""
    data = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {server.address}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode()  # fmt: skip
    conn = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    conn.sendall(head + data)
    return conn


def _logged(server: Server, status: int) -> list[dict[str, Any]]:
    access = server.log.parent / "access.jsonl"
    rows = [json.loads(x) for x in access.read_text().splitlines()] if access.exists() else []
    return [r for r in rows if r["status"] == status]


HOLDER = "The quick brown fox"  # 14 tokens; greedy, it runs its LONG tokens without an EOS


def test_an_unstreamed_request_whose_client_leaves_is_cancelled(server: Server) -> None:
    """The client closes the connection while its 500 tokens are made: the sequence ends early (the
    access log's 499 and tokens_out), and the place and the pool are free again."""
    body = {"model": NAME, "prompt": "1, 2, 3", "temperature": 0, "max_tokens": LONG}
    with contextlib.closing(_post(server, "/v1/completions", body)):
        wait_for(lambda: _metric(server, "pipe_sequences_running") == 1, timeout=10)
    wait_for(lambda: bool(_logged(server, 499)), timeout=10)
    row = _logged(server, 499)[0]
    assert row["route"] == "/v1/completions" and 0 < row["tokens_out"] < LONG
    wait_for(lambda: _idle(server), timeout=10)


@contextlib.contextmanager
def _holding(server: Server) -> Iterator[None]:
    """Long streams holding every place, each running (a stream's answer begins with its first token).
    On leaving they are closed, and the access log must show them cut short: they were still running
    when everything inside the block had been answered."""
    before = len(_holders(server))
    with contextlib.ExitStack() as stack:
        for _ in range(PLACES):  # one at a time: --max-waiting 1 would refuse them together
            body = {"model": NAME, "prompt": HOLDER, "temperature": 0, "max_tokens": LONG, "stream": True}
            holder = stack.enter_context(contextlib.closing(_post(server, "/v1/completions", body)))
            assert holder.makefile("rb").readline().startswith(b"HTTP/1.1 200")
        yield
    wait_for(lambda: len(_holders(server)) == before + PLACES, timeout=10)
    assert all(r["tokens_out"] < LONG for r in _holders(server)[before:])
    wait_for(lambda: _idle(server), timeout=10)


def _holders(server: Server) -> list[dict[str, Any]]:
    return [r for r in _logged(server, 200) if r["route"] == "/v1/completions" and r["tokens_in"] == 14]


def _timed(server: Server, path: str, body: dict[str, Any]) -> tuple[httpx.Response, float]:
    started = time.perf_counter()
    answer = httpx.post(f"{server.url}{path}", json=body, timeout=30)
    return answer, time.perf_counter() - started


def test_a_full_queue_and_a_wait_past_the_timeout_are_503s_with_retry_after(server: Server) -> None:
    """Streams hold every place; of two requests sent together one waits in the one slot, so the other
    is refused at once (--max-waiting); the waiting one is answered 503 after --timeout."""
    short = {"model": NAME, "prompt": "1, 2", "temperature": 0, "max_tokens": 2}
    with _holding(server), ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: _timed(server, "/v1/completions", short), range(2)))
    (full, _), (waited, seconds) = sorted(answers, key=lambda a: a[1])
    for answer in (full, waited):
        assert answer.status_code == 503 and answer.headers["retry-after"] == "1", answer.text
        assert answer.json()["error"]["type"] == "server_error"
    assert "requests are already waiting for this model (--max-waiting 1)" in full.json()["error"]["message"]
    assert f"waited {WAIT_S:g}s (--timeout)" in waited.json()["error"]["message"] and seconds >= WAIT_S


def test_a_stream_that_waits_past_the_timeout_is_a_503_before_its_headers(server: Server) -> None:
    body = {"text_input": "1, 2", "parameters": {"max_tokens": 2, "temperature": 0}}
    with _holding(server):
        streamed, seconds = _timed(server, f"/v2/models/{NAME}/generate_stream", body)
    assert streamed.status_code == 503 and streamed.headers["retry-after"] == "1"
    assert streamed.headers["content-type"].startswith("application/json"), streamed.text
    assert "removed from the queue" in streamed.json()["error"] and seconds >= WAIT_S
