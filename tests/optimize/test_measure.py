"""Latency timed side by side: every model at every batch, sane statistics, and orderings noise cannot flip.

No test asserts absolute milliseconds (the machine is shared); the only timing claim is that 20
chained MatMuls are much slower than one, a gap far wider than any noise.
"""

from __future__ import annotations

import gc
import re
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
import pytest

import pipeline.runtime.latency as measure_module
from pipeline.core.errors import ArtifactError, InputError
from pipeline.runtime.latency import Latency, measure, speedup

WIDTH = 256
QUICK = {"seconds": 0.1, "warmup": 1, "min_runs": 10, "max_runs": 300}


def chain(tmp_path: Path, layers: int, batch: str = "N", name: str | None = None) -> Path:
    """y = x @ w @ w ... (`layers` MatMuls), w a WIDTH x WIDTH matrix of 0.01s: cost grows with `layers`."""
    steps = "\n".join(f"  h{i + 1} = MatMul(h{i}, w)" for i in range(layers))
    model = onnx.parser.parse_model(f"""
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[{batch}, {WIDTH}] x) => (float[{batch}, {WIDTH}] y) {{
      shape = Constant <value = int64[2] {{{WIDTH}, {WIDTH}}}> ()
      w = ConstantOfShape <value = float[1] {{0.01}}> (shape)
      h0 = Identity(x)
    {steps}
      y = Identity(h{layers})
    }}""")
    onnx.checker.check_model(model)
    path = tmp_path / f"{name or f'chain{layers}'}.onnx"
    onnx.save(model, path)
    return path


def samples(rows: int = 40) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(0).standard_normal((rows, WIDTH)).astype(np.float32)}


def test_every_model_is_timed_at_every_batch_with_consistent_statistics(tmp_path: Path) -> None:
    models = {"one": chain(tmp_path, 1), "twenty": chain(tmp_path, 20)}
    results = measure(models, samples(), batches=(1, 32), **QUICK)
    assert set(results) == {"one", "twenty"}
    for latency in results.values():
        assert latency.fixed_batch is None and latency.skipped == () and latency.threads == 1
        assert set(latency.batches) == {1, 32}
        for batch, timing in latency.batches.items():
            assert timing.batch == batch
            assert 0 < timing.p50_ms <= timing.p95_ms
            assert timing.runs >= QUICK["min_runs"] and timing.runs <= QUICK["max_runs"]
            assert timing.throughput == pytest.approx(batch / (timing.mean_ms / 1e3))
        flat = latency.to_dict()
        assert {"p50_ms_b1", "p95_ms_b1", "p50_ms_b32", "p95_ms_b32", "throughput_b32", "threads"} <= set(flat)
        assert all(isinstance(value, float) for value in flat.values())
        assert flat["p50_ms_b32"] == latency.at(32).p50_ms


def test_twenty_chained_matmuls_are_much_slower_than_one(tmp_path: Path) -> None:
    models = {"one": chain(tmp_path, 1), "twenty": chain(tmp_path, 20)}
    results = measure(models, samples(), batches=(1, 32), **QUICK)
    for batch in (1, 32):
        # speedup(baseline, other): > 1 when `other` is faster. Twenty layers do twenty times the
        # work; even at batch 1, where per-call overhead dominates, the gap is several-fold.
        assert speedup(results["twenty"], results["one"], batch) > 2
        assert speedup(results["one"], results["twenty"], batch) < 0.5


def test_a_fixed_batch_model_runs_at_its_own_batch_only_and_says_so(tmp_path: Path) -> None:
    models = {
        "free": chain(tmp_path, 1),
        "fixed1": chain(tmp_path, 1, batch="1", name="fixed1"),
        "fixed4": chain(tmp_path, 1, batch="4", name="fixed4"),
    }
    messages: list[str] = []
    results = measure(models, samples(), batches=(1, 32), progress=messages.append, **QUICK)

    assert results["fixed1"].fixed_batch == 1 and set(results["fixed1"].batches) == {1}
    assert results["fixed1"].skipped == (32,)
    assert results["fixed1"].to_dict()["fixed_batch"] == 1.0
    with pytest.raises(InputError, match="fixed at 1"):
        results["fixed1"].at(32)

    # A fixed batch outside `batches` still runs, and the free model is timed beside it there.
    assert results["fixed4"].fixed_batch == 4 and set(results["fixed4"].batches) == {4}
    assert results["fixed4"].skipped == (1, 32)
    assert set(results["free"].batches) == {1, 4, 32}
    assert "fixed_batch" not in results["free"].to_dict()
    assert speedup(results["free"], results["fixed4"], 4) > 0
    assert any("fixed batch of 1" in message for message in messages)


def test_fewer_samples_than_the_batch_are_repeated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fed: list[np.ndarray] = []
    real_feed = measure_module._feed

    def spy(*args: object) -> dict[str, np.ndarray]:
        feed = real_feed(*args)  # type: ignore[arg-type]
        fed.append(feed["x"])
        return feed

    monkeypatch.setattr(measure_module, "_feed", spy)
    few = samples(rows=3)
    results = measure({"one": chain(tmp_path, 1)}, few, batches=(2, 7), **QUICK)
    assert set(results["one"].batches) == {2, 7}
    two, seven = fed
    np.testing.assert_array_equal(two, few["x"][:2])
    np.testing.assert_array_equal(seven, few["x"][[0, 1, 2, 0, 1, 2, 0]])


def test_sessions_come_from_the_one_factory_once_each(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[object, ...]] = []
    real_create = measure_module.create_session

    def spy(path: Path, provider: str, **threads: int) -> ort.InferenceSession:
        calls.append((Path(path).name, provider, threads))
        return real_create(path, provider, **threads)

    monkeypatch.setattr(measure_module, "create_session", spy)
    models = {"one": chain(tmp_path, 1), "two": chain(tmp_path, 2)}
    results = measure(models, samples(), batches=(1, 32), threads=2, **QUICK)
    assert sorted(calls) == [
        ("chain1.onnx", "cpu", {"intra_op_threads": 2, "inter_op_threads": 1}),
        ("chain2.onnx", "cpu", {"intra_op_threads": 2, "inter_op_threads": 1}),
    ]
    assert results["one"].to_dict()["threads"] == 2.0


def test_run_counts_respect_min_and_max(tmp_path: Path) -> None:
    models = {"one": chain(tmp_path, 1), "twenty": chain(tmp_path, 20)}
    # A budget too short for even one run still gives min_runs samples ...
    short = measure(models, samples(), batches=(1,), seconds=1e-9, warmup=0, min_runs=7, max_runs=50)
    assert all(latency.at(1).runs >= 7 for latency in short.values())
    # ... and max_runs ends the timing long before a long budget does.
    capped = measure(models, samples(), batches=(1,), seconds=60, warmup=0, min_runs=1, max_runs=12)
    assert [latency.at(1).runs for latency in capped.values()] == [12, 12]


def test_the_garbage_collector_is_restored_after_timing(tmp_path: Path) -> None:
    assert gc.isenabled()
    measure({"one": chain(tmp_path, 1)}, samples(), batches=(1,), **QUICK)
    assert gc.isenabled()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"batches": ()}, "batches"),
        ({"batches": (0, 32)}, "batches"),
        ({"threads": 0}, "threads is 0"),
        ({"seconds": 0}, "seconds is 0"),
        ({"warmup": -1}, "warmup is -1"),
        ({"min_runs": 20, "max_runs": 10}, "min_runs 20 and max_runs 10"),
    ],
)
def test_settings_that_would_time_nothing_are_refused(tmp_path: Path, settings: dict, message: str) -> None:
    with pytest.raises(InputError, match=message):
        measure({"one": tmp_path / "never-opened.onnx"}, samples(), **settings)


def test_a_missing_input_is_named(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="needs input 'x'.*'y'"):
        measure({"one": chain(tmp_path, 1)}, {"y": samples()["x"]}, **QUICK)


def test_latency_without_the_batch_names_what_was_measured() -> None:
    latency = Latency(batches={}, threads=1)
    with pytest.raises(InputError, match=r"no latency at batch 8; measured at \[\]"):
        latency.at(8)


@pytest.mark.parametrize("warmup", [0, 1])
def test_a_model_that_cannot_run_is_named(tmp_path: Path, warmup: int) -> None:
    # Its graph declares [N, WIDTH] but the samples are [rows, 3]: onnxruntime refuses the feed.
    narrow = {"x": np.zeros((4, 3), np.float32)}
    with pytest.raises(ArtifactError, match="model 'one' failed to run at batch 1"):
        measure({"one": chain(tmp_path, 1)}, narrow, batches=(1,), **{**QUICK, "warmup": warmup})


class _Recorder:
    """Stands in for an onnxruntime session in the scheduling test: it only notes when it ran."""

    def __init__(self, name: str, calls: list[str]) -> None:
        self.name, self.calls = name, calls

    def run(self, _outputs: object, _feed: object) -> None:
        self.calls.append(self.name)


def test_no_model_mostly_runs_behind_the_same_neighbour() -> None:
    """A fixed rotation put each model behind one neighbour in (n-1)/n of rounds: a systematic bias."""
    from collections import Counter

    from pipeline.runtime.latency import _time_interleaved

    calls: list[str] = []
    names = ["a", "b", "c", "d"]
    sessions = {n: _Recorder(n, calls) for n in names}
    _time_interleaved(sessions, {n: {} for n in names}, 1, seconds=0.0, warmup=0, min_runs=400, max_runs=400)
    rounds = [calls[i : i + 4] for i in range(0, len(calls), 4)]
    assert all(sorted(r) == names for r in rounds)  # every model once per round
    for name in names:
        before = Counter(r[r.index(name) - 1] for r in rounds if r.index(name) > 0)
        assert max(before.values()) / sum(before.values()) < 0.6, (name, before)


def test_a_state_whose_batch_is_axis_1_is_timed_at_every_batch(tmp_path: Path) -> None:
    """Silero VAD's state is [2, batch, 128] (`--batch-axis state:1`, stamped as pipe.sample_axes): its first dim
    is no fixed batch. Read as one, the model was timed at batch 2 only, fed the state's samples on the wrong axis."""
    from pipeline.runtime.sample_axes import METADATA_KEY, SampleAxes

    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[N, 6] x, float[2, N, 4] state) => (float[N, 6] y, float[2, N, 4] out) {
      y = Identity(x)
      out = Identity(state)
    }""")
    stamp = SampleAxes({"state": 1}, {"out": 1})
    model.metadata_props.add(key=METADATA_KEY, value=stamp.metadata())
    path = tmp_path / "vad.onnx"
    onnx.save(model, path)
    rng = np.random.default_rng(0)
    inputs = {"x": rng.standard_normal((5, 6)).astype(np.float32),
              "state": rng.standard_normal((5, 2, 4)).astype(np.float32)}  # fmt: skip
    latency = measure({"vad": path}, inputs, batches=(1, 3), **QUICK)["vad"]
    assert latency.fixed_batch is None and set(latency.batches) == {1, 3}, latency
    feed = measure_module._feed("vad", ort.InferenceSession(str(path)), inputs, 3)
    assert feed["state"].shape == (2, 3, 4) and np.array_equal(feed["state"][:, 1], inputs["state"][1])


@pytest.mark.parametrize(
    ("settings", "refused"),
    [
        ({}, ""),
        ({"threads": 0}, "threads is 0; give 1 or more"),
        ({"seconds": 0}, "seconds is 0; give a positive duration"),
        ({"seconds": 0.0}, "seconds is 0.0; give a positive duration"),
        ({"seconds": -1.0}, "seconds is -1.0; give a positive duration"),
        ({"seconds": 1e-9}, ""),
        ({"warmup": -1}, "warmup is -1; give 0 or more runs"),
        ({"min_runs": 0}, "min_runs 0 and max_runs 5 need 1 <= min_runs <= max_runs"),
        ({"min_runs": 1, "max_runs": 1}, ""),
        ({"min_runs": 20, "max_runs": 10}, "min_runs 20 and max_runs 10 need"),
        ({"threads": 0, "seconds": 0, "warmup": -1}, "threads is 0.*; seconds is 0;.*; warmup is -1;"),
    ],
)
def test_latency_and_lm_speed_judge_the_timing_settings_alike(settings: dict, refused: str) -> None:
    """One rule for the settings both side-by-side timings take (runtime/rounds.py `timing_problems`):
    a value one refuses the other refuses, in the same words, and 0 seconds is refused by both. With no
    models both always refuse, so the words after "no models to time" are the timing settings' verdict."""
    from pipeline.runtime.lm_speed import measure_lm

    full = {"threads": 1, "seconds": 1.0, "warmup": 0, "min_runs": 1, "max_runs": 5} | settings
    ids = np.ones((1, 4), dtype=np.int64)
    with pytest.raises(InputError) as latency:
        measure({}, samples(), **full)
    with pytest.raises(InputError) as lm_speed:
        measure_lm({}, None, ids, ids, 1, **full)  # type: ignore[arg-type]  # refused before the cache is read
    verdict = str(latency.value).removeprefix("cannot measure latency: no models to time")
    assert str(lm_speed.value) == "lm speed: no models to time" + verdict
    if refused:
        assert re.match(f"; {refused}", verdict), verdict
    else:
        assert verdict == ""
