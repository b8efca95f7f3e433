"""Every numeric option of every command refuses NaN, infinity, negatives and absurd sizes with exit 2.

Before the shared types (pipeline/cli/params.py): `pipe check --latency-seconds inf` and `pipe benchmark
--seconds inf` were OverflowErrors (exit 3), `--threads 100000` crashed libgomp, `pipe serve --timeout nan`
answered every request 500 and `--max-queue-delay-ms inf` every request 503 after 30 s. Each value here
is refused while the command line is read, before any artifact is opened or any server started.
Check's budgets are the recipe schema's to judge (tests/check/test_check_budgets.py).
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from pipeline.cli import main
from tests.export.test_export_import import linear_model

NAN, INF, NEG, HUGE, DIGITS = "nan", "inf", "-1", "1e30", "9" * 5000
COMMANDS = {  # command line before the option; the artifact paths need not exist: nothing is opened
    "check": ["check", "missing", "--baseline", "missing"],
    "benchmark": ["benchmark", "missing"],
    "train": ["train", "missing.yaml"],
    "export": ["export", "missing"],
    "serve": ["serve", "missing"],
    "predict": ["predict", "missing", "--input", "missing.npz"],
    "optimize": ["optimize", "missing"],
    "import": ["import", "missing.onnx", "--name", "x"],
}
CASES = [
    ("check", "--latency-seconds", [NAN, INF, "0", NEG, HUGE]),
    ("benchmark", "--seconds", [NAN, INF, "0", NEG, HUGE]),
    ("benchmark", "--threads", ["0", NEG, "100000", DIGITS, "1.5"]),
    ("train", "--epochs", ["0", NEG, DIGITS, NAN]),
    ("train", "--nproc", ["0", NEG, "100000", DIGITS]),
    ("export", "--opset", ["0", NEG, DIGITS]),
    ("export", "--atol", [NAN, INF, NEG]),
    ("export", "--rtol", [NAN, INF, NEG]),
    ("export", "--metric-tolerance", [NAN, INF, NEG]),
    ("export", "--max-out-of-tolerance", [NAN, INF, NEG, "1.5"]),
    ("import", "--atol", [NAN, INF, NEG]),
    ("optimize", "--max-accuracy-drop", [NAN, INF, NEG]),  # the gate's flags, the same on every hop
    ("optimize", "--min-cosine", [NAN, INF, "0", NEG, "1.5"]),
    ("serve", "--port", ["70000", DIGITS, NAN]),
    ("serve", "--workers", ["100000", DIGITS]),
    ("serve", "--timeout", [NAN, INF, HUGE]),
    ("serve", "--max-queue-delay-ms", [NAN, INF, HUGE]),
    ("serve", "--max-body-mb", [NAN, INF, HUGE]),
    ("serve", "--graceful-timeout", [NAN, INF, NEG, HUGE]),
    ("serve", "--read-timeout", [NAN, INF, HUGE]),
    ("serve", "--poll", [NAN, INF, NEG]),
    ("serve", "--max-batch-size", [DIGITS, "1e9"]),
    ("serve", "--max-queue", [DIGITS]),
    ("serve", "--instances", ["100000"]),
    ("serve", "--intra-op-threads", ["100000", NAN]),
    ("serve", "--inter-op-threads", ["100000"]),
    ("serve", "--latest", [DIGITS]),
    ("predict", "--top-k", ["0", NEG, DIGITS]),
]


@pytest.mark.parametrize(("command", "option", "values"), CASES, ids=[f"{c}{o}" for c, o, _ in CASES])
def test_a_bad_number_is_exit_2_naming_the_option(command: str, option: str, values: list[str]) -> None:
    for value in values:
        result = CliRunner().invoke(main, [*COMMANDS[command], option, value])
        shown = value if len(value) < 40 else f"{len(value)} digits"
        assert result.exit_code == 2, (option, shown, result.output[-500:])
        assert option in result.output and "Traceback" not in result.output, (option, shown, result.output[-500:])
        assert len(result.output) < 2000, (option, shown)  # a 5,000-digit value is not echoed back whole


OPTIMIZE = [  # judged by the recipe schema (one line naming the flag and the key), so a real artifact is opened
    ("--calibration-samples", ["0", NEG, "100000000"]),
    ("--max-exclusions", [NEG, "100000000"]),
    ("--threads", ["0", NEG, "100000"]),
]


def test_optimize_settings_refuse_bad_numbers_in_one_line(tmp_path: Path) -> None:
    onnx.save(linear_model(), tmp_path / "linear.onnx")
    repo = tmp_path / "repo"
    assert CliRunner().invoke(main, ["import", str(tmp_path / "linear.onnx"), "--name", "l", "--repository", str(repo),
                                     "--task", "embedding"]).exit_code == 0  # fmt: skip
    for option, values in OPTIMIZE:
        for value in values:
            result = CliRunner().invoke(main, ["optimize", str(repo / "l" / "1"), option, value])
            assert result.exit_code == 2, (option, value, result.output)
            assert option in result.output and len(result.output.strip().splitlines()) == 1, (
                option,
                value,
                result.output,
            )
