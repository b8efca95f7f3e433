"""Loading in-process: any onnxruntime load failure refuses that version only; hot reload outlives a bad scan."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import onnxruntime as ort
import pytest

from pipeline.core.errors import ArtifactError
from pipeline.serve import scan as scan_module
from pipeline.serve.batching import BatchSettings
from pipeline.serve.metrics import Metrics
from pipeline.serve.repository import Repository, RepositorySettings
from pipeline.serve.session import ModelSession, SessionOptions
from tests.serve.serve_models import mlp, write_artifact

OPTIONS = SessionOptions(provider="cpu", intra_op_threads=1, inter_op_threads=1)


def test_a_provider_failure_at_load_is_an_artifact_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(mlp([4, 8, 3]).SerializeToString())

    def fails(*args: object, **kwargs: object) -> None:
        raise ort.capi.onnxruntime_pybind11_state.EPFail("the device went away")

    monkeypatch.setattr(ort, "InferenceSession", fails)
    with pytest.raises(ArtifactError, match="onnxruntime cannot load the model.*the device went away"):
        ModelSession(path, OPTIONS)


def test_sessions_come_from_the_one_factory_with_the_server_settings(tmp_path: Path) -> None:
    """Threads and spin reach onnxruntime, and a file that is not a model is the factory's one-line ArtifactError."""
    path = tmp_path / "m.onnx"
    path.write_bytes(mlp([4, 8, 3]).SerializeToString())
    session = ModelSession(path, SessionOptions(provider="cpu", intra_op_threads=2, inter_op_threads=1, spin=False))
    options = session.session.get_session_options()
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (2, 1)
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert session.providers == ["CPUExecutionProvider"]
    path.write_bytes(b"not a model")
    with pytest.raises(ArtifactError, match=r"m\.onnx: onnxruntime cannot load the model: .*INVALID_PROTOBUF"):
        ModelSession(path, OPTIONS)


def test_hot_reload_keeps_watching_after_an_unexpected_scan_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "artifacts"
    write_artifact(repo, "m", 1, mlp([4, 8, 3], seed=1))
    scans: list[int] = []
    real_find = scan_module.find_versions

    def flaky_find(paths: tuple[Path, ...]) -> scan_module.Scan:
        scans.append(1)
        if len(scans) == 2:  # the first scan after startup hits a bug
            raise RuntimeError("unexpected")
        return real_find(paths)

    monkeypatch.setattr(scan_module, "find_versions", flaky_find)

    async def main() -> list[int]:
        with ThreadPoolExecutor(1) as pool:
            settings = RepositorySettings((repo,), poll_s=0.01)
            repository = Repository(settings, OPTIONS, BatchSettings(), Metrics(), pool)
            await repository.start()
            write_artifact(repo, "m", 2, mlp([4, 8, 3], seed=2))
            for _ in range(1000):
                if 2 in repository.models["m"]:
                    break
                await asyncio.sleep(0.01)
            await repository.stop()
            return sorted(repository.models["m"])

    assert asyncio.run(main()) == [1, 2]
    assert len(scans) >= 3
