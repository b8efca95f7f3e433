"""The side-by-side latency check catches a slower model whose outputs are the same bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort

from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import load_golden
from tests.check.check_models import imported, invoke, linear, regressions, reports

# Rounds run both models until the faster one has its seconds of runs: 0.05 s is ~12,000 runs of the
# 4 us baseline beside ~12,000 of the 25 us candidate (0.35 s), three times over once past the budget.
QUICK = ("--latency-seconds", "0.05")


def test_a_needless_heavy_op_that_leaves_the_outputs_alone_fails_on_latency_with_its_ratio(tmp_path: Path) -> None:
    base = imported(tmp_path, linear(), "base")
    slow = imported(tmp_path, linear(heavy=128), "slow")
    inputs = load_golden(Artifact.load(base)).inputs
    outputs = [ort.InferenceSession(str(root / "model.onnx")).run(None, inputs)[0] for root in (base, slow)]
    assert np.array_equal(*outputs)  # the same model to a client, but for its speed

    # a handful of nodes more is 20-ish % more bytes on a model this small: the size budget is not what is tested
    result = invoke("check", str(slow), "--baseline", str(base), "--max-size-increase", "1", *reports(tmp_path), *QUICK)
    assert result.exit_code == 1, result.output
    failed = regressions(result.output, tmp_path)
    assert list(failed) == ["latency"], failed
    figures = next(c for c in json.loads((tmp_path / "c.json").read_text())["checks"] if c["name"] == "latency")[
        "figures"
    ]
    assert figures["ratio"] > 2 and figures["budget"] == 1.10  # K=128 costs about 7x a 4-input linear layer
    assert (
        failed["latency"].startswith("p50 at batch 1 ")
        and f"x{figures['ratio']:.3f} (budget x1.100" in (failed["latency"])
    )
    assert len(figures["ratios"]) == 3  # past the budget: measured again twice, the median judged

    # the same two models under a budget that allows the ratio: measured once, passed
    loose = invoke("check", str(slow), "--baseline", str(base), "--max-size-increase", "1",
                   "--max-latency-increase", "1000", *QUICK)  # fmt: skip
    assert loose.exit_code == 0, loose.output
