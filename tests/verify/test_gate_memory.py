"""The gate's memory: what judging a large output holds at once, bounded.

PP-OCRv4's recognizer judged on 64 pictures peaked at 1.8 GiB in `pipe optimize` (docs/optimize.md):
onnxruntime's arena kept each session's largest chunk reserved, one chunk held 64 samples because only
input bytes sized it, and comparing an output of [64, 40, 6625] made five float64 copies of it at once.
Each is held to its bound here with numpy's own allocation tracking (tracemalloc sees numpy's buffers),
not the process's RSS, so the figures do not move with the machine.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import onnx.parser

from pipeline.runtime.runners import CHUNK_BYTES, FIRST_CALL, chunk_size, ort_runner, run_chunked
from pipeline.verify.budgets import TensorAgreement
from pipeline.verify.policies import Exact


def traced_peak(call: object) -> int:
    """Bytes numpy allocated at most while `call()` ran, above what was held before."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        call()  # type: ignore[operator]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - before


def outputs(shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    want = rng.random(shape)
    return want + rng.normal(0, 1e-6, shape), want


def test_a_lossless_comparison_holds_two_output_sized_arrays_at_most() -> None:
    got, want = outputs((16, 40, 1000))  # 5.1 MB each in float64
    judged = Exact().compare(got, want)
    assert judged.passed and judged.max_abs > 0
    peak = traced_peak(lambda: Exact().compare(got, want))
    assert peak <= 2.2 * want.nbytes, f"Exact.compare held {peak / want.nbytes:.1f}x the output (bound 2.2x)"


def test_the_figures_of_a_budgeted_comparison_hold_two_output_sized_arrays_at_most() -> None:
    got, want = outputs((16, 40, 1000))
    peak = traced_peak(lambda: TensorAgreement().compare(got, want))
    assert peak <= 2.2 * want.nbytes, f"TensorAgreement.compare held {peak / want.nbytes:.1f}x the output"


def old_exact(got: np.ndarray, want: np.ndarray, atol: float, rtol: float) -> tuple[float, float, float, float]:
    """Exact's figures as they were computed before, with a temporary per step: share, worst, max abs, max rel."""
    diff = np.abs(got - want)
    tolerance = atol * max(1.0, float(np.abs(want).max())) + rtol * np.abs(want)
    with np.errstate(divide="ignore", invalid="ignore"):
        max_rel = float(np.nanmax(diff / np.maximum(np.abs(want), atol)))
    over = diff > tolerance
    with np.errstate(divide="ignore"):
        ratio = np.where(over, diff / np.where(tolerance > 0, tolerance, 1.0), 0.0)
    ratio = np.where(over & (tolerance == 0), np.inf, ratio)
    return float(over.mean()), float(ratio.max()), float(diff.max()), max_rel


def test_lossless_figures_are_unchanged_by_working_in_place() -> None:
    rng = np.random.default_rng(1)
    want = rng.normal(0, 5, (8, 300))
    want[0, :10] = 0.0
    got = want + rng.normal(0, 2e-3, want.shape)
    for atol, rtol in ((1e-4, 1e-3), (1e-3, 0.0), (0.0, 0.0)):
        judged = Exact(atol=atol, rtol=rtol, max_share=1.0).compare(got, want)
        share, worst, max_abs, max_rel = old_exact(got, want, atol, rtol)
        assert (judged.share, judged.worst, judged.max_abs) == (share, worst, max_abs)
        assert judged.max_rel == max_rel or (np.isinf(max_rel) and np.isinf(judged.max_rel))
    zero = Exact(atol=0.0, rtol=0.0, max_share=1.0).compare(np.array([1.0, 1.0]), np.array([1.0, 1.5]))
    assert zero.worst == np.inf and not zero.passed  # no tolerance at all: a value off by any amount is infinitely over


def wide(tmp_path: Path) -> Path:
    """A model whose output per sample (64 KB) is 64 times its input: x [N, 1] -> y [N, 16384]."""
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[N, 1] x) => (float[N, 16384] y) {
        ones = ConstantOfShape <value = float[1] {1.0}> (shape)
        y = Mul(x, ones)
    }""")
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array([1, 16384], np.int64), "shape"))
    path = tmp_path / "wide.onnx"
    onnx.save(model, path)
    return path


def test_chunks_are_sized_by_a_samples_inputs_and_outputs(tmp_path: Path) -> None:
    calls: list[int] = []
    run = ort_runner(wide(tmp_path))

    def counted(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        calls.append(len(inputs["x"]))
        return run(inputs)

    x = np.arange(600, dtype=np.float32)[:, None]
    got = run_chunked(counted, {"x": x})
    per_sample = 4 + 16384 * 4
    assert chunk_size(per_sample) == CHUNK_BYTES // per_sample == 255  # inputs alone (4 bytes) would allow 256
    assert calls[0] == FIRST_CALL and max(calls) == 255 // FIRST_CALL * FIRST_CALL and sum(calls) == 600
    np.testing.assert_array_equal(got["y"][:, 0], x[:, 0])
    np.testing.assert_array_equal(got["y"][:, -1], x[:, 0])
    assert run_chunked(run, {"x": x[:1]})["y"].shape == (1, 16384)
    assert run_chunked(run, {"x": x[:0]})["y"].shape == (0, 16384)  # an empty split still gives its shapes


def test_gate_sessions_give_their_memory_back() -> None:
    tmp = Path(__import__("tempfile").mkdtemp())
    session = ort_runner(wide(tmp)).session
    assert session.get_session_options().enable_cpu_mem_arena is False
