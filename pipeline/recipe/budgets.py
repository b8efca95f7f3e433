"""The recipe's `budgets` section: what `pipe check` treats as a regression against the baseline.

Each task metric is held to its entry in `budgets.metrics`, else to `max_accuracy_drop`, else to a
default in the metric's own terms: an absolute drop for unitless metrics (accuracy, r2), a share of
the baseline's value for metrics in the target's units (mae, rmse) and for the loss.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field, model_validator

from pipeline.artifact.directions import HIGHER_IS_BETTER, IN_TARGET_UNITS
from pipeline.recipe.strict import Strict

DEFAULT_CHECK_DROP = 0.005  # pipe check: unitless metrics (accuracy, r2) may drop this much by default
DEFAULT_CHECK_RELATIVE = 0.01  # pipe check: metrics in target units (mae, rmse) may rise 1% of the baseline
# pipe check: the test loss may rise 5% of the baseline's: its scale is the objective's (nats, standardized
# squared error) and it moves more than accuracy between two sound runs
DEFAULT_LOSS_RELATIVE = 0.05


class MetricBudget(Strict):
    """One task metric's budgets in `budgets.metrics`: it fails `pipe check` when it breaks either."""

    model_config = ConfigDict(allow_inf_nan=True)  # .inf: unbounded (not gated); NaN fails ge=0

    max_drop: float | None = Field(None, ge=0)  # in the metric's units (for MAE a rise is a drop)
    max_relative_drop: float | None = Field(None, ge=0)  # drop / |baseline value|: 0.02 = 2% of it

    @model_validator(mode="after")
    def _one_at_least(self) -> MetricBudget:
        if self.max_drop is None and self.max_relative_drop is None:
            raise ValueError("give max_drop, max_relative_drop or both (or leave the metric out)")
        return self


class BudgetSpec(Strict):
    """What `pipe check` treats as a regression against the committed baseline."""

    model_config = ConfigDict(allow_inf_nan=True)  # .inf: unbounded (`--max-accuracy-drop inf`); NaN fails ge=0

    # absolute drop of every metric not listed in `metrics`; None: 0.005 for unitless metrics (accuracy, r2)
    # and 1% of the baseline's value for metrics in the target's units (mae, rmse: never a fixed amount of USD)
    max_accuracy_drop: float | None = Field(None, ge=0)
    metrics: dict[str, MetricBudget] = {}  # per metric (accuracy, mae): its own budgets, in place of the above
    max_latency_increase: float = Field(0.10, ge=0)  # fraction: 0.10 = more than 10% slower fails (docs/check.md)
    max_size_increase: float = Field(0.10, ge=0)
    # decoders (text-generation): the candidate's perplexity on held-out text may rise this share of the baseline's
    max_perplexity_increase: float = Field(0.05, ge=0)
    # decoders: the least share of the baseline's greedy tokens (golden prompts) generated alike; None: reported only
    min_greedy_agreement: float | None = Field(None, ge=0, le=1)

    @model_validator(mode="after")
    def _known_metrics(self) -> BudgetSpec:
        unknown = sorted(set(self.metrics) - set(HIGHER_IS_BETTER))
        if unknown:  # nothing would ever judge it: a misspelt name must not pass silently
            raise ValueError(
                f"budgets.metrics: no task metric named {', '.join(map(repr, unknown))}; the metrics pipe check "
                f"judges are {', '.join(HIGHER_IS_BETTER)}"
            )
        return self

    def for_metric(self, name: str) -> MetricBudget:
        """The budgets `name` is held to: its `metrics` entry, else max_accuracy_drop as an absolute drop,
        else the default: DEFAULT_CHECK_DROP, or a relative drop for a metric in units, the loss and perplexity."""
        if name in self.metrics:
            return self.metrics[name]
        if self.max_accuracy_drop is not None:
            return MetricBudget(max_drop=self.max_accuracy_drop)
        if name in IN_TARGET_UNITS:
            return MetricBudget(max_relative_drop=DEFAULT_CHECK_RELATIVE)
        if name == "loss":
            return MetricBudget(max_relative_drop=DEFAULT_LOSS_RELATIVE)
        if name == "perplexity":  # a decoder's: a share of the baseline's, as its held-out text is judged
            return MetricBudget(max_relative_drop=self.max_perplexity_increase)
        return MetricBudget(max_drop=DEFAULT_CHECK_DROP)
