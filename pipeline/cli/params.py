"""The numeric option types every command shares: finite, bounded, and named in the refusal.

A duration of `inf` overflowed timers, a `nan` timeout answered every request 500 and 100,000 threads
crashed libgomp: every number a user can type goes through one of these, so `nan`, `inf` (unless a
budget means "unbounded"), negatives where nothing negative makes sense, and values past a sane upper
bound are exit 2 naming the option and the valid range. (Regression budgets are floats checked by
the recipe schema itself, where `inf` means unbounded and NaN or a negative is one line, exit 2.)
"""

from __future__ import annotations

import math
from typing import Any

import click


def _flag(param: click.Parameter | None) -> str:
    return param.opts[0] if param is not None and param.opts else "the value"


class Number(click.ParamType):
    """A float within [low, high] (`low_open`: strictly above low); `inf` only where `allow_inf` (a budget)."""

    name = "number"

    def __init__(
        self, low: float | None = None, high: float | None = None, *, low_open: bool = False, allow_inf: bool = False
    ) -> None:
        self.low, self.high, self.low_open, self.allow_inf = low, high, low_open, allow_inf

    def range(self) -> str:
        low = "" if self.low is None else f"{'>' if self.low_open else '>='} {self.low:g}"
        high = "" if self.high is None else f"<= {self.high:g}"
        return " and ".join(filter(None, (low, high))) or "finite"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        flag = _flag(param)
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{flag} {value!r} is not a number; give a number {self.range()}", param, ctx)
        if math.isnan(number) or (math.isinf(number) and not (self.allow_inf and number > 0)):
            self.fail(f"{flag} {value} is not a finite number; give a number {self.range()}", param, ctx)
        below = self.low is not None and (number < self.low or (self.low_open and number == self.low))
        if below or (self.high is not None and number > self.high and not math.isinf(number)):
            self.fail(f"{flag} {value} must be {self.range()}", param, ctx)
        return number


class Whole(click.ParamType):
    """A whole number within [low, high]."""

    name = "integer"

    def __init__(self, low: int | None = None, high: int | None = None) -> None:
        self.low, self.high = low, high

    def range(self) -> str:
        parts = ([f">= {self.low}"] if self.low is not None else []) + ([f"<= {self.high}"] if self.high else [])
        return " and ".join(parts) or "whole"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        flag = _flag(param)
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            try:  # a 5,000-digit string is refused by int() itself (ValueError), not converted
                number = int(str(value).strip())
            except ValueError:
                shown = str(value) if len(str(value)) <= 40 else f"{str(value)[:20]}... ({len(str(value))} characters)"
                self.fail(f"{flag} {shown!r} is not a whole number; give one {self.range()}", param, ctx)
        if (self.low is not None and number < self.low) or (self.high is not None and number > self.high):
            shown = str(number) if len(str(number)) <= 40 else f"a {len(str(number))}-digit number"
            self.fail(f"{flag} {shown} must be {self.range()}", param, ctx)
        return number


MAX_THREADS = 256  # more threads than any machine pipe runs on has cores; 100,000 crashed libgomp
THREADS = Whole(1, MAX_THREADS)  # threads a runtime gets
TOLERANCE = Number(0)  # a parity tolerance
FRACTION = Number(0, 1)  # a score or an overlap: detection's confidence and NMS IoU


# Where train, run and import put a new version; `--out` was train's name for it, kept as an alias.
REPOSITORY = click.option(
    "--repository",
    "--out",
    "out_root",
    default="artifacts",
    show_default=True,
    type=click.Path(),
    help="The model repository the new version goes into (--out: the same, kept for old scripts).",
)
