"""One candidate of the auto search: the settings it was quantized with, its verdict, file, size and speed.

Below the search, the repair and the timer, which all read and write trials; `speed_verdict` says
faster, on par or slower than fp32 from a ratio timed side by side, NOISE being the band of "on par".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.optimize.judge import Verdict
from pipeline.optimize.quantize import QuantSettings
from pipeline.verify.report import GateReport, Row

NOISE = 0.05  # ratios within 5% of 1 are "on par": side-by-side runs of one model differ by a few % on a busy machine


def speed_verdict(speedup: float | None) -> str:
    """faster, on par or slower than fp32, from the p50 ratio (fp32 / candidate); untimed without one."""
    if speedup is None:
        return "untimed"
    if speedup >= 1 + NOISE:
        return "faster"
    if speedup <= 1 / (1 + NOISE):
        return "slower"
    return "on par"


@dataclass
class Trial:
    """One quantized model the search made and judged."""

    name: str  # the settings in words, plus the nodes left in fp32
    settings: QuantSettings
    verdict: Verdict
    path: Path  # the quantized file (absent when quantization itself failed: see verdict.detail)
    size: int  # bytes; 0 when no file was made
    excluded: tuple[str, ...] = ()  # nodes the search left in fp32 (beyond the settings' own)
    latency: dict[str, float] | None = None  # Latency.to_dict(), timed beside fp32; None: not timed
    fp32_latency: dict[str, float] | None = None  # the fp32 model timed in the same run
    speedup: dict[int, float] = field(default_factory=dict)  # batch -> fp32 p50 / this trial's p50, same run
    warnings: list[str] = field(default_factory=list)  # what quantize reported doing otherwise than asked

    @property
    def speed(self) -> str:
        """faster, on par or slower than fp32 at the first batch timed (1, or a fixed batch); untimed."""
        return speed_verdict(self.speedup[min(self.speedup)] if self.speedup else None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "settings": self.settings.to_dict(),
            "verdict": {
                "passed": self.verdict.passed,
                "figure": finite(self.verdict.figure),
                "margin": finite(self.verdict.margin),
                "detail": self.verdict.detail,
            },
            "file": self.path.name if self.size else None,
            "size": self.size,
            "excluded": list(self.excluded),
            "latency": self.latency,
            "fp32_latency": self.fp32_latency,
            **{f"speedup_b{b}": ratio for b, ratio in self.speedup.items()},
            "speed": self.speed,
            "warnings": self.warnings,
        }


def failed_verdict(detail: str) -> Verdict:
    """The verdict of a candidate that produced no model to judge."""
    return Verdict(False, math.nan, -math.inf, detail, GateReport([Row("quantize", "-", False, detail)]))


def finite(value: float) -> float | None:
    """A figure for JSON: NaN and infinities (nothing measured) become null."""
    return value if math.isfinite(value) else None
