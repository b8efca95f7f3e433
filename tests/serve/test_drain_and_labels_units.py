"""In-process: the drain's signal hook, the labels file and the version policy, each alone."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from pipeline.artifact.directory import LOCK_NAME
from pipeline.artifact.labels import LABELS_NAME, read_labels, write_label
from pipeline.core.errors import ArtifactError, InputError
from pipeline.serve.drain import CloseWhileDraining, Drain
from pipeline.serve.version_policy import default_version, held_by_labels


def _with_handlers(run):  # the test's own handlers for SIGINT/SIGTERM, restored afterwards
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return run()
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_a_signal_starts_the_drain_and_the_stop_comes_after_it() -> None:
    stops: list[tuple[int, float]] = []

    async def scenario() -> tuple[bool, list]:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):  # stands for uvicorn's handler
            signal.signal(sig, lambda s, f: stops.append((s, loop.time())))
        drain = Drain(0.3)
        drain.install()
        started = loop.time()
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(0.05)
        draining_early, stopped_early = drain.draining, list(stops)
        os.kill(os.getpid(), signal.SIGTERM)  # a second SIGTERM changes nothing
        await asyncio.sleep(0.5)
        assert draining_early and stopped_early == []
        return drain.draining, [(s, t - started) for s, t in stops]

    draining, seen = _with_handlers(lambda: asyncio.run(scenario()))
    assert draining and len(seen) == 1 and seen[0][0] == signal.SIGTERM and 0.25 < seen[0][1] < 0.6, seen


def test_ctrl_c_again_stops_at_once_and_a_zero_drain_passes_the_signal_on() -> None:
    stops: list[int] = []

    async def scenario(seconds: float) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda s, f: stops.append(s))
        Drain(seconds).install()
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.sleep(0.05)

    _with_handlers(lambda: asyncio.run(scenario(60)))
    assert stops == [signal.SIGINT]  # the second Ctrl-C ended a 60 s drain
    stops.clear()
    _with_handlers(lambda: asyncio.run(scenario(0)))
    assert stops == [signal.SIGINT, signal.SIGINT]  # no drain: each signal goes to uvicorn as it came


def test_connection_close_is_added_only_while_draining() -> None:
    drain = Drain(5)
    sent: list[dict] = []

    async def app(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})

    async def send(message: dict) -> None:
        sent.append(message)

    wrapped = CloseWhileDraining(app, drain)
    asyncio.run(wrapped({"type": "http"}, None, send))
    drain.draining = True
    asyncio.run(wrapped({"type": "http"}, None, send))
    assert (b"connection", b"close") not in sent[0]["headers"]
    assert sent[1]["headers"] == [(b"content-type", b"text/plain"), (b"connection", b"close")]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "must be an object of label -> version"),
        ('{"Stable": 1}', "'Stable' is not a label name"),
        ('{"stable": "3"}', "label 'stable' must name a version number >= 1, got '3'"),
        ('{"stable": 0}', "got 0"),
        ('{"stable": true}', "got True"),
    ],
)
def test_a_malformed_labels_file_is_one_line_naming_it(tmp_path: Path, text: str, needle: str) -> None:
    (tmp_path / LABELS_NAME).write_text(text)
    with pytest.raises(ArtifactError, match="labels.json") as refused:
        read_labels(tmp_path)
    assert needle in str(refused.value) and "\n" not in str(refused.value)


def test_labels_are_written_atomically_and_moved(tmp_path: Path) -> None:
    assert read_labels(tmp_path) == {}
    assert write_label(tmp_path, "stable", 1) is None
    assert write_label(tmp_path, "canary", 2) is None
    assert write_label(tmp_path, "stable", 2) == 1
    assert read_labels(tmp_path) == {"canary": 2, "stable": 2}
    assert write_label(tmp_path, "canary", None) == 2
    assert read_labels(tmp_path) == {"stable": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_NAME, LABELS_NAME]  # no temporary file left
    with pytest.raises(InputError, match="is not a label name"):
        write_label(tmp_path, "../x", 1)


def test_the_default_version_follows_stable_and_never_falls_back_to_the_newest() -> None:
    assert default_version([1, 2, 3], {}) == (3, None)
    assert default_version([1, 2, 3], {"stable": 2, "canary": 3}) == (2, None)
    version, why = default_version([1, 3], {"stable": 2})
    assert version is None and "'stable' label names v2, which is not served" in why
    assert held_by_labels("all", 3, {}) is None and held_by_labels("promoted", 2, {"canary": 2}) is None
    assert "v3 has no label (labels: canary: v2)" in held_by_labels("promoted", 3, {"canary": 2})
