"""Fixtures for the server tests: a repository of real artifacts and real `pipe serve` processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.artifact.labels import LABELS_NAME
from tests.serve.serve_models import embed, mlp, strings, two_in_two_out, write_artifact
from tests.serve.serve_process import Server, start_server


@pytest.fixture(scope="session")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """artifacts/: mlp v1 and v2 (different weights, v2 with an `opt` variant; labels stable v2, canary v1),
    pair, embed, strings."""
    repo = tmp_path_factory.mktemp("serve") / "artifacts"
    write_artifact(repo, "mlp", 1, mlp([4, 8, 3], seed=1))
    write_artifact(repo, "mlp", 2, mlp([4, 8, 3], seed=2), variants={"opt": mlp([4, 8, 3], seed=2, scale=2.0)})
    (repo / "mlp" / LABELS_NAME).write_text('{"stable": 2, "canary": 1}')
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
