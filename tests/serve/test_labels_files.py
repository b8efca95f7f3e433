"""labels.json under attack: promotes at once lose no label, and a labels file that is a FIFO, huge or nested
deeply is refused by its own model alone, without holding the server's event loop."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pipeline.artifact.directory import LOCK_NAME
from pipeline.artifact.labels import LABELS_NAME, MAX_BYTES, read_labels, write_label
from pipeline.core.errors import ArtifactError
from tests.serve.health_probe import HealthProbe
from tests.serve.serve_models import mlp, write_artifact
from tests.serve.serve_process import Server, start_server, wait_for

PROMOTERS, LABELS_EACH = 12, 4


def _promote(model_root: str, worker: int, barrier: multiprocessing.synchronize.Barrier) -> None:
    barrier.wait(10)
    for i in range(LABELS_EACH):
        write_label(Path(model_root), f"w{worker}-{i}", worker + 1)


def test_promotes_at_once_keep_every_label(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(PROMOTERS)
    workers = [context.Process(target=_promote, args=(str(tmp_path), w, barrier)) for w in range(PROMOTERS)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    assert [w.exitcode for w in workers] == [0] * PROMOTERS
    labels = read_labels(tmp_path)
    assert len(labels) == PROMOTERS * LABELS_EACH, f"{PROMOTERS * LABELS_EACH - len(labels)} labels lost"
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_NAME, LABELS_NAME]


def test_a_fifo_a_huge_or_a_deep_labels_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / LABELS_NAME)  # no writer: a plain open() would wait forever
    started = time.perf_counter()
    with pytest.raises(ArtifactError, match="is not a regular file"):
        read_labels(tmp_path)
    assert time.perf_counter() - started < 1
    (tmp_path / LABELS_NAME).unlink()
    with open(tmp_path / LABELS_NAME, "wb") as f:
        f.truncate(50 * 2**20)  # 50 MB, sparse: refused by its size, never read
    with pytest.raises(ArtifactError, match=f"holds {50 * 2**20} bytes, more than a labels file's {MAX_BYTES}"):
        read_labels(tmp_path)
    (tmp_path / LABELS_NAME).write_text("[" * 20_000 + "]" * 20_000)
    with pytest.raises(ArtifactError, match="nested too deeply"):
        read_labels(tmp_path)
    with pytest.raises(ArtifactError, match="nested too deeply"):  # promote over it: a refusal, not exit 3
        write_label(tmp_path, "stable", 1)


@pytest.fixture(scope="module")
def labelled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    repo = tmp_path_factory.mktemp("labels") / "artifacts"
    for name in ("fifo", "deep", "fine"):
        write_artifact(repo, name, 1, mlp([4, 8, 3], seed=1))
        write_artifact(repo, name, 2, mlp([4, 8, 3], seed=2))
        write_label(repo / name, "stable", 1)
    running = start_server([repo], tmp_path_factory.mktemp("log") / "serve.log", "--poll", "0.2")
    yield running, repo
    running.stop()


def test_bad_labels_files_never_hold_the_server_nor_stop_the_scan(labelled: tuple[Server, Path]) -> None:
    server, repo = labelled
    with HealthProbe(server) as probe:
        (repo / "fifo" / LABELS_NAME).unlink()
        os.mkfifo(repo / "fifo" / LABELS_NAME)
        (repo / "deep" / LABELS_NAME).write_text("[" * 20_000 + "]" * 20_000)
        write_label(repo / "fine", "stable", 2)  # the other models' labels still move
        with httpx.Client(base_url=server.url, timeout=10) as http:
            wait_for(lambda: "stable" in http.get("/v2/models/fine/versions/2").json()["parameters"].get("labels", []))
            wait_for(lambda: "labels_error" in http.get("/v2/models/deep/ready").json())
            fifo = http.get("/v2/models/fifo/ready").json()
            deep = http.get("/v2/models/deep").json()
            unversioned = http.get("/v2/models/fifo").json()
            time.sleep(1.0)  # five more scans with the probe running
    print(probe.report())
    assert probe.failed == [] and probe.worst_s < 1.0, probe.report()
    assert "is not a regular file" in fifo["labels_error"] and fifo["ready"] is True
    assert "nested too deeply" in deep["parameters"]["labels_error"]
    assert unversioned["parameters"]["version"] == "1"  # the labels read before are kept: stable is still v1
    assert "kept the labels of fifo as they were" in server.logs()
    assert "Traceback" not in server.logs()
