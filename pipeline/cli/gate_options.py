"""The gate's flags, the same on every command that makes a file from another (import, export, optimize).

Each flag is a key of the hop's settings section (recipe/gates.py), so `--atol` means in `pipe import` what
`atol:` means in a recipe's `edge:` section or a settings file's (`--settings FILE`,
pipeline/stagekit/settings_file.py). A command takes every flag, and refuses (exit 2, naming the flag and
why) one its hop would not read: a lossy budget for a hop that makes only lossless files, any gate flag
for a hop with no gate. Never ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from pipeline.cli.params import TOLERANCE, Number
from pipeline.core.errors import InputError

F = TypeVar("F", bound=Callable[..., Any])

# setting -> its flag: the lossless hop's tolerances, then the lossy candidates' budgets
LOSSLESS_FLAGS = {
    "atol": "--atol",
    "rtol": "--rtol",
    "metric_tolerance": "--metric-tolerance",
    "max_out_of_tolerance": "--max-out-of-tolerance",
}
BUDGET_FLAGS = {
    "max_accuracy_drop": "--max-accuracy-drop",
    "min_cosine": "--min-cosine",
    "mean_cosine": "--mean-cosine",
    "min_agreement": "--min-agreement",
    "min_token_agreement": "--min-token-agreement",
    "max_kl": "--max-kl",
}
GATE_FLAGS = {**LOSSLESS_FLAGS, **BUDGET_FLAGS}


def gate_options(what: str) -> Callable[[F], F]:
    """Add the gate's flags and `--settings` to a command; `what` says in the help where each default comes from."""

    def add(command: F) -> F:
        options = [
            click.option("--atol", type=TOLERANCE, default=None,
                         help=f"Lossless: a value's absolute difference allowed, in units of its output's scale "
                         f"(largest |value|, >= 1) [default: {what}, 1e-4]."),
            click.option("--rtol", type=TOLERANCE, default=None,
                         help=f"Lossless: plus this fraction of the value's magnitude [default: {what}, 1e-3]."),
            click.option("--metric-tolerance", type=TOLERANCE, default=None,
                         help=f"Lossless: the task metric's difference allowed [default: {what}, 1e-3]."),
            click.option("--max-out-of-tolerance", type=Number(0, 1), default=None,
                         help="Lossless: the share of an output's values allowed past atol/rtol (none past 10x) "
                         f"[default: {what}, 1e-4]."),
            click.option("--max-accuracy-drop", type=Number(0), default=None,
                         help="Lossy (fp16, int8): the task metric's drop allowed, in its units [default: "
                         f"{what}; 0.01, edge classifiers 0.015]."),
            click.option("--min-cosine", type=Number(0, 1, low_open=True), default=None,
                         help="Lossy, embeddings and tensor models: the worst row's least cosine to the reference "
                         f"[default: {what}, 0.9]."),
            click.option("--mean-cosine", type=Number(0, 1, low_open=True), default=None,
                         help="Lossy, embeddings and tensor models: the rows' mean cosine to the reference, at "
                         f"least [default: {what}, 0.99]."),
            click.option("--min-agreement", type=Number(0, 1, low_open=True), default=None,
                         help="Lossy, classifiers without targets and text recognizers: the least share of samples "
                         f"answered as the reference answers them [default: {what}; 0.99, texts 0.95]."),
            click.option("--min-token-agreement", type=Number(0, 1), default=None,
                         help="Lossy, decoders: the least share of next tokens chosen as the reference chooses them, "
                         f"teacher-forced on held-out text [default: {what}, 0.9]."),
            click.option("--max-kl", type=Number(0), default=None,
                         help="Lossy, decoders: the most mean KL divergence from the reference's next-token "
                         f"distribution, nats per token [default: {what}, 0.05]."),
            click.option("--settings", "settings_file", type=click.Path(), default=None,
                         help="A YAML settings file with a section per hop (import, export, optimize, edge), for "
                         "any artifact; flags override it. See docs/recipes.md."),
        ]  # fmt: skip
        for option in reversed(options):
            command = option(command)
        return command

    return add


def gate_flags(options: dict[str, Any]) -> dict[str, Any]:
    """The gate's values out of a command's keyword arguments (removed from them), keyed like the settings."""
    return {key: options.pop(key, None) for key in GATE_FLAGS}


def refuse(given: dict[str, Any], flags: dict[str, str], why: str) -> None:
    """InputError (exit 2) naming each flag of `flags` that was given, and `why` the hop does not read it."""
    named = [flag for key, flag in flags.items() if given.get(key) is not None]
    if named:
        raise InputError(f"{', '.join(named)}: {why}")
