"""The gate's findings: one row per check, one table, and CheckFailed (exit 1) when any row failed."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline.core.errors import CheckFailed


@dataclass
class Row:
    """One line of the gate's table."""

    check: str  # "checker", "shape inference", "batch 2", "batch 2, sequence 8", "metric accuracy"
    output: str  # the output it concerns, or "-"
    passed: bool
    detail: str = ""
    max_abs: float | None = None
    max_rel: float | None = None
    share: float | None = None  # element-wise (lossless) rows: the share of the output's values out of tolerance
    worst: float | None = None  # and the worst value's difference in multiples of its tolerance


@dataclass
class GateReport:
    """Every row the gate produced, plus the metric on both sides."""

    rows: list[Row] = field(default_factory=list)
    # {"name", "reference", <candidate name, e.g. "onnx">, "difference", "samples"}; empty without a metric
    metric: dict[str, Any] = field(default_factory=dict)

    @property
    def failures(self) -> list[Row]:
        return [r for r in self.rows if not r.passed]

    @property
    def passed(self) -> bool:
        return not self.failures

    def table(self, only_failures: bool = False) -> str:
        """A fixed-width text table; the CLI prints it, CheckFailed carries it."""
        rows = self.failures if only_failures else self.rows
        head = ("check", "output", "status", "max abs", "max rel", "out of tol", "detail")
        body = [
            (r.check, r.output, "ok" if r.passed else "FAIL", _num(r.max_abs), _num(r.max_rel), _num(r.share), r.detail)
            for r in rows
        ]
        widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=True)]
        return "\n".join(
            "  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)).rstrip() for line in (head, *body)
        )

    def raise_on_failure(self, what: str) -> None:
        """Raise CheckFailed (exit 1) listing every failed row; `what` names the candidate."""
        if self.failures:
            raise CheckFailed(
                f"{what} failed the parity gate ({len(self.failures)} of {len(self.rows)} checks):\n"
                + self.table(only_failures=True)
            )

    def to_dict(self) -> dict[str, Any]:
        """What a stage record keeps: passed, every row, the metric."""
        return {"passed": self.passed, "rows": [asdict(r) for r in self.rows], "metric": self.metric}

    def summary(self) -> dict[str, Any]:
        """The gate in a few numbers, for a variant record: passed, worst differences, checks run."""
        abs_diffs = [r.max_abs for r in self.rows if r.max_abs is not None]
        rel_diffs = [r.max_rel for r in self.rows if r.max_rel is not None]
        shares = [r.share for r in self.rows if r.share is not None]
        return {
            "passed": self.passed,
            "checks": len(self.rows),
            "failed": len(self.failures),
            "max_abs": max(abs_diffs, default=None),
            "max_rel": max(rel_diffs, default=None),
            "out_of_tolerance": max(shares, default=None),
        }


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:.3g}"
