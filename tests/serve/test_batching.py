"""The dynamic batcher with a real onnxruntime session, in-process."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from pipeline.serve.batching import Batcher, BatchSettings
from pipeline.serve.errors import RequestError, Unavailable
from pipeline.serve.metrics import Metrics
from pipeline.serve.session import ModelSession, SessionOptions
from tests.serve.serve_models import embed, mlp, run_reference

OPTIONS = SessionOptions(provider="cpu", intra_op_threads=1, inter_op_threads=1)


@pytest.fixture(scope="module")
def mlp_session(tmp_path_factory: pytest.TempPathFactory) -> ModelSession:
    path = tmp_path_factory.mktemp("batch") / "mlp.onnx"
    path.write_bytes(mlp([4, 16, 3], seed=3).SerializeToString())
    return ModelSession(path, OPTIONS)


def test_requests_of_different_sizes_are_batched_and_split_back(mlp_session: ModelSession) -> None:
    rng = np.random.default_rng(0)
    requests = [rng.standard_normal((int(rng.integers(1, 6)), 4)).astype(np.float32) for _ in range(24)]
    stats = Metrics().model("m", 1)

    async def main() -> list[dict[str, np.ndarray]]:
        with ThreadPoolExecutor(2) as pool:
            settings = BatchSettings(max_batch_size=32, max_queue_delay_ms=20)
            batcher = Batcher(mlp_session.run, mlp_session.batchable, settings, pool, stats)
            results = await asyncio.gather(*(batcher.infer({"x": x}, len(x)) for x in requests))
            await batcher.close()
            return results

    results = asyncio.run(main())
    reference = run_reference(mlp([4, 16, 3], seed=3), {"x": np.concatenate(requests)})["logits"]
    offset = 0
    for x, result in zip(requests, results, strict=True):
        assert result["logits"].shape == (len(x), 3)
        np.testing.assert_allclose(result["logits"], reference[offset : offset + len(x)], rtol=1e-5, atol=1e-6)
        offset += len(x)
    assert stats.inferences == sum(len(x) for x in requests)
    assert stats.executions < len(requests) / 3, f"{stats.executions} runs for {len(requests)} requests"


def test_one_bad_request_does_not_fail_its_batch(tmp_path: Path) -> None:
    path = tmp_path / "embed.onnx"
    path.write_bytes(embed().SerializeToString())
    session = ModelSession(path, OPTIONS)
    good = np.array([[1, 2]], dtype=np.int64)
    bad = np.array([[1, 50]], dtype=np.int64)  # index 50 is outside the 10-row table

    async def main() -> list:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(session.run, True, BatchSettings(max_queue_delay_ms=20), pool, Metrics().model("m", 1))
            results = await asyncio.gather(
                *(batcher.infer({"ids": a}, 1) for a in (good, bad, good)), return_exceptions=True
            )
            await batcher.close()
            return results

    first, failed, last = asyncio.run(main())
    assert isinstance(failed, RequestError) and "could not run on this input" in str(failed)
    np.testing.assert_array_equal(first["doubled"], good * 2)
    np.testing.assert_array_equal(last["doubled"], good * 2)


def test_full_queue_and_timeout_are_503(mlp_session: ModelSession) -> None:
    x = np.zeros((1, 4), np.float32)
    release = threading.Event()

    async def main() -> tuple[list, BaseException]:
        with ThreadPoolExecutor(1) as pool:
            pool.submit(release.wait, 10)  # the only compute thread is busy: requests pile up
            settings = BatchSettings(max_queue=3, max_queue_delay_ms=0, timeout_s=0.5)
            batcher = Batcher(mlp_session.run, True, settings, pool, Metrics().model("m", 1))
            tasks = [asyncio.ensure_future(batcher.infer({"x": x}, 1)) for _ in range(6)]
            await asyncio.sleep(0.1)
            refused = [t.exception() for t in tasks if t.done()]
            timed_out = await asyncio.gather(*(t for t in tasks if not t.done()), return_exceptions=True)
            release.set()
            await batcher.close()
            return refused, timed_out[0]

    refused, timed_out = asyncio.run(main())
    assert len(refused) == 3 and all(  # 3 queued (max_queue), the other 3 refused
        isinstance(e, Unavailable) and "queue for this model is full" in str(e) for e in refused
    )
    assert refused[0].status == 503 and refused[0].headers == {"retry-after": "1"}
    assert isinstance(timed_out, Unavailable) and "within the 0.5s timeout" in str(timed_out)


def test_oversized_request_is_refused(mlp_session: ModelSession) -> None:
    async def main() -> None:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(mlp_session.run, True, BatchSettings(max_batch_size=4), pool, Metrics().model("m", 1))
            try:
                with pytest.raises(RequestError, match="holds 5 rows, more than this model's max batch size 4"):
                    await batcher.infer({"x": np.zeros((5, 4), np.float32)}, 5)
            finally:
                await batcher.close()

    asyncio.run(main())


def test_fixed_batch_model_runs_each_request_alone(tmp_path: Path) -> None:
    path = tmp_path / "fixed.onnx"
    path.write_bytes(mlp([4, 8, 3], seed=4, batch=1).SerializeToString())
    session = ModelSession(path, OPTIONS)
    assert not session.batchable
    with pytest.raises(RequestError, match=r"shape \[2, 4\], the model expects x: FP32\[1, 4\]"):
        session.check_inputs({"x": np.zeros((2, 4), np.float32)})
    xs = [np.full((1, 4), i, np.float32) for i in range(5)]
    stats = Metrics().model("m", 1)

    async def main() -> list:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(session.run, False, BatchSettings(max_queue_delay_ms=20), pool, stats)
            results = await asyncio.gather(*(batcher.infer({"x": x}, 1) for x in xs))
            await batcher.close()
            return results

    for x, result in zip(xs, asyncio.run(main()), strict=True):
        np.testing.assert_allclose(result["logits"], run_reference(mlp([4, 8, 3], seed=4, batch=1), {"x": x})["logits"])
    assert stats.executions == 5 and stats.inferences == 5


def test_a_server_fault_in_a_run_answers_every_request_at_once(mlp_session: ModelSession) -> None:
    """A failure that is not onnxruntime refusing data reaches each waiting request, not its timeout."""

    def broken(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise MemoryError("no room for the batch")

    x = np.zeros((1, 4), np.float32)

    async def main() -> list:
        with ThreadPoolExecutor(1) as pool:
            settings = BatchSettings(max_queue_delay_ms=20, timeout_s=30)
            batcher = Batcher(broken, True, settings, pool, Metrics().model("m", 1))
            results = await asyncio.wait_for(
                asyncio.gather(*(batcher.infer({"x": x}, 1) for _ in range(3)), return_exceptions=True), 10
            )
            await batcher.close()
            return results

    results = asyncio.run(main())
    assert all(isinstance(r, MemoryError) for r in results), results


def test_close_answers_a_request_whose_batch_is_still_filling(mlp_session: ModelSession) -> None:
    """A hot reload closes the old batcher while a batch may be waiting for more requests: it must run, not vanish."""
    x = np.ones((1, 4), np.float32)

    async def main() -> dict[str, np.ndarray]:
        with ThreadPoolExecutor(1) as pool:
            settings = BatchSettings(max_queue_delay_ms=300, timeout_s=5)
            batcher = Batcher(mlp_session.run, True, settings, pool, Metrics().model("m", 1))
            request = asyncio.ensure_future(batcher.infer({"x": x}, 1))
            await asyncio.sleep(0.05)  # taken from the queue; the batch waits up to 300 ms for more
            await asyncio.wait_for(batcher.close(), 3)
            return await asyncio.wait_for(request, 1)

    result = asyncio.run(main())
    np.testing.assert_allclose(result["logits"], run_reference(mlp([4, 16, 3], seed=3), {"x": x})["logits"], rtol=1e-5)


def test_a_closed_batcher_lets_go_of_its_session_at_once(mlp_session: ModelSession) -> None:
    """A hot reload drops the old version: its session (weights, onnxruntime threads) must be freed
    when the last reference goes, not whenever the cyclic garbage collector next runs."""

    class Run:
        def __call__(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return mlp_session.run(feeds)

    async def main() -> weakref.ref:
        with ThreadPoolExecutor(1) as pool:
            run = Run()
            batcher = Batcher(run, True, BatchSettings(), pool, Metrics().model("m", 1))
            await batcher.infer({"x": np.ones((1, 4), np.float32)}, 1)
            await batcher.close()
            alive = weakref.ref(run)
            del run, batcher
            return alive

    gc.disable()  # what is freed here is freed by reference counting alone
    try:
        alive = asyncio.run(main())
        assert alive() is None, [type(r).__name__ for r in gc.get_referrers(alive())]
    finally:
        gc.enable()
