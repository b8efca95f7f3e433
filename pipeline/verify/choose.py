"""The one place a hop's gate policy is chosen.

Every hop that makes a file from another (export: torch -> ONNX; import: a source ONNX or
transformers model -> model.onnx; optimize: model.onnx -> variants/; edge: model.onnx -> TFLite)
asks `hop_policy` what its candidate is held to, from the hop, the candidate's precision, the
task, whether the evaluation set has targets, the hop's gate settings and the detector's record:

- a lossless candidate (`fp32`: an export, an import, a graph-only optimization, fp32 TFLite) is
  held to `Exact(atol, rtol, metric_tolerance, max_out_of_tolerance)`: values within tolerance of
  each output's scale, but for a documented few (policies.py);
- every lossy candidate (fp16 and int8, on every target: optimize and edge alike) is held to the
  task's budget over the evaluation split (`_task_budget`), never element by element:
  `mean_cosine` and `min_cosine` for embeddings (and tensor models' unit-vector outputs), `max_accuracy_drop` for a
  task metric measured on targets, agreement, relative error or boxes otherwise; a decoder's
  (text-generation) to `min_token_agreement` and `max_kl` teacher-forced on held-out text.

Every setting can be given to every hop where it means something (`GateSettings`); one that
nothing would read for this artifact is refused, naming what is read instead, never ignored.
Defaults are the hop's: edge's int8 classifier may lose 1.5 accuracy points, optimize's 1.
`describe_held` reads the same choice back from a stage's record for the reports.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from pipeline.artifact.manifest import TASKS, Detection
from pipeline.core.errors import InputError
from pipeline.verify.budgets import (
    DEFAULT_MAX_DROP,
    DEFAULT_MEAN_COSINE,
    DEFAULT_MIN_COSINE,
    BoxAgreement,
    CosineAgreement,
    MetricDrop,
    RelativeError,
    TensorAgreement,
    TextAgreement,
    Top1Agreement,
)
from pipeline.verify.lm_judge import DEFAULT_MAX_KL, DEFAULT_MIN_TOKEN_AGREEMENT, TokenAgreement
from pipeline.verify.metrics import METRIC_TASKS
from pipeline.verify.policies import Exact, Policy

Hop = Literal["export", "import", "optimize", "edge"]
HOPS: tuple[Hop, ...] = ("export", "import", "optimize", "edge")
LOSSLESS = "fp32"  # the precision of a candidate that must compute what its reference computes
# edge int8 of a classifier: 1.5 accuracy points by default (LiteRT's int8 kernels round more than onnxruntime's)
EDGE_CLASSIFIER_DROP = 0.015
COSINE_TASKS = ("embedding", "tensor")  # the tasks a cosine budget (mean_cosine, min_cosine) judges
TEXT_GENERATION = "text-generation"  # decoders: judged teacher-forced on text (min_token_agreement, max_kl)


@dataclass(frozen=True)
class GateSettings:
    """What a hop's gate may be told, whichever hop: the recipe section's keys, or a stage record's."""

    atol: float = Exact.atol  # lossless: per-element absolute difference (edge's fp32: `atol_fp32` before)
    rtol: float = Exact.rtol  # lossless: plus this fraction of the reference's magnitude
    metric_tolerance: float = Exact.metric  # lossless: |metric(candidate) - metric(reference)|
    max_out_of_tolerance: float = Exact.max_share  # lossless: the share of an output's values allowed out of tolerance
    max_accuracy_drop: float | None = None  # lossy: the task metric's drop in its units; None: the hop's default
    min_cosine: float | None = None  # lossy, embeddings and unit-vector tensors: the worst row; None: 0.9
    mean_cosine: float | None = None  # lossy, embeddings and unit-vector tensors: the rows' mean; None: 0.99
    # lossy, classifiers without targets (top-1 agreement; None: 0.99) and text recognizers (text agreement;
    # None: 0.95): the least share of samples answered as the reference answers them
    min_agreement: float | None = None
    min_token_agreement: float | None = None  # lossy, decoders: next-token agreement; None: lm_judge's default
    max_kl: float | None = None  # lossy, decoders: mean KL per token from the reference; None: lm_judge's default

    @classmethod
    def read(cls, section: Mapping[str, Any]) -> GateSettings:
        """The gate's settings in a stage's settings (a recipe section dumped, a record, overrides): the keys
        it has, the defaults for the rest; None means "not given" wherever it stands."""
        given = {"atol": section.get("atol_fp32"), **section}
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in given.items() if k in names and v is not None})


def hop_policy(
    hop: Hop,
    precision: str,
    task: str,
    has_target: bool,
    settings: GateSettings,
    detection: Detection | None = None,
) -> Policy:
    """The policy the `hop`'s `precision` candidate of a `task` model is held to; see the module doc.

    `has_target`: the evaluation set has targets, so a task metric can be measured. Raises InputError
    for a budget nothing could measure on this artifact (a metric drop without targets, a cosine for
    a classifier), naming the setting and what is read instead.
    """
    if hop not in HOPS:
        raise InputError(f"no gate for hop {hop!r}; hops are {', '.join(HOPS)}")
    _refuse_unread(hop, precision, task, has_target, settings)
    if precision == LOSSLESS:
        return Exact(settings.atol, settings.rtol, settings.metric_tolerance, settings.max_out_of_tolerance)
    drop = settings.max_accuracy_drop
    if drop is None and hop == "edge" and task == "classification" and has_target:
        drop = EDGE_CLASSIFIER_DROP
    if task == TEXT_GENERATION:
        return TokenAgreement(
            DEFAULT_MIN_TOKEN_AGREEMENT if settings.min_token_agreement is None else settings.min_token_agreement,
            DEFAULT_MAX_KL if settings.max_kl is None else settings.max_kl,
        )
    return _task_budget(task, has_target, drop, _cosine(settings), settings.min_agreement, detection)


def _cosine(settings: GateSettings) -> CosineAgreement:
    """The cosine budget of embeddings and unit-vector tensor outputs: the settings given, the defaults for the rest."""
    return CosineAgreement(
        DEFAULT_MIN_COSINE if settings.min_cosine is None else settings.min_cosine,
        DEFAULT_MEAN_COSINE if settings.mean_cosine is None else settings.mean_cosine,
    )


def _task_budget(
    task: str,
    has_target: bool,
    drop: float | None,
    cosine: CosineAgreement,
    agreement: float | None,
    detection: Detection | None,
) -> Policy:
    """The budget a lossy candidate of a `task` model is held to (`drop`, `agreement`: None for the defaults).

    - classification: MetricDrop(drop, default 0.01) when the evaluation set has targets, else
      Top1Agreement(agreement, default 0.99);
    - regression: MetricDrop(drop) when `drop` is given (MAE, in the target's units), else
      RelativeError(0.01), which needs no units;
    - embedding: CosineAgreement: the rows' mean cosine (default 0.99) and the worst row's (default 0.9);
    - detection: BoxAgreement(0.9), decoding with the artifact's `detection` settings (defaults when None);
    - tensor: TensorAgreement (the cosine budget for unit-vector outputs, else relative error 0.01, by output);
    - text-recognition: TextAgreement(agreement, default 0.95), texts read as the parent reads them, or
      MetricDrop(drop) of text agreement on the targets when `drop` is given and the evaluation set has them.
    - text-generation (decoders) never reach here: `hop_policy` holds them to TokenAgreement (lm_judge.py).
    """
    if task not in TASKS:
        raise InputError(f"task {task!r} has no budget; tasks are {', '.join(TASKS)}")
    if task == "classification":
        if has_target:
            return MetricDrop(DEFAULT_MAX_DROP if drop is None else drop)
        return Top1Agreement() if agreement is None else Top1Agreement(agreement)
    if task == "regression":
        return RelativeError() if drop is None else MetricDrop(drop)
    if task == "detection":
        d = detection or Detection()
        return BoxAgreement(confidence=d.confidence, iou=d.iou, max_detections=d.max_detections)
    if task == "tensor":
        return TensorAgreement(min_cosine=cosine.min_cosine, mean_cosine=cosine.mean_cosine)
    if task == "text-recognition":  # texts read the same as the parent's; the drop of text agreement on targets
        if drop is not None and has_target:
            return MetricDrop(drop)
        return TextAgreement() if agreement is None else TextAgreement(agreement)
    return cosine


def _refuse_unread(hop: Hop, precision: str, task: str, has_target: bool, settings: GateSettings) -> None:
    """A budget given for this hop that nothing would read on this artifact: refused, never ignored."""
    text = [f"{k} {v:g}" for k, v in (("min_token_agreement", settings.min_token_agreement),
                                      ("max_kl", settings.max_kl)) if v is not None]  # fmt: skip
    if text and precision != LOSSLESS and task != TEXT_GENERATION:
        raise InputError(
            f"{', '.join(text)}: the budget of decoders (text-generation), judged on text; this is a {task} model: "
            "leave it out (its budget is --max-accuracy-drop or --min-cosine)"
        )
    for key in ("min_cosine", "mean_cosine"):
        value = getattr(settings, key)
        if value is not None and precision != LOSSLESS and task not in COSINE_TASKS:
            raise InputError(
                f"{key} {value:g} is a budget of embedding and tensor models; this is a {task} model: give "
                "max_accuracy_drop (--max-accuracy-drop, the task metric's drop) instead"
            )
    drop = settings.max_accuracy_drop
    _refuse_unread_agreement(task, has_target, precision, settings)
    if drop is None or precision == LOSSLESS:
        return
    if task == "embedding":
        cosine = _cosine(settings)
        raise InputError(
            f"max_accuracy_drop {drop:g} cannot be measured: an embedding model has no task metric; its budget is "
            f"cosine: mean_cosine (--mean-cosine, now {cosine.mean_cosine:g}) and min_cosine (--min-cosine, the "
            f"worst row, now {cosine.min_cosine:g})"
        )
    if task not in METRIC_TASKS:
        raise InputError(f"max_accuracy_drop {drop:g} cannot be measured: a {task} model has no task metric; "
                         "leave it unset")  # fmt: skip
    if not has_target:
        raise InputError(
            f"max_accuracy_drop {drop:g} cannot be measured: the evaluation set has no targets (imported without "
            "labelled --eval-data); leave it unset, or re-import with labelled evaluation data"
        )


def _refuse_unread_agreement(task: str, has_target: bool, precision: str, settings: GateSettings) -> None:
    """min_agreement is read by a classifier's top-1 agreement (no targets) and a text recognizer's text agreement
    (unless a metric drop on targets judges it); given anywhere else it is refused, naming what is read."""
    agreement = settings.min_agreement
    if agreement is None or precision == LOSSLESS:
        return
    measured = has_target and (task == "classification" or settings.max_accuracy_drop is not None)
    if task in ("classification", "text-recognition") and measured:
        raise InputError(
            f"min_agreement {agreement:g} is not read: the evaluation set has targets, so the budget is the task "
            "metric's drop (max_accuracy_drop, --max-accuracy-drop); leave min_agreement unset"
        )
    if task not in ("classification", "text-recognition"):
        raise InputError(
            f"min_agreement {agreement:g} is a budget of classifiers without targets and text recognizers; this is "
            f"a {task} model: leave it unset (docs/gates.md names its budget)"
        )


def refuse_unread_budgets(hop: Hop, precisions: list[str], settings: GateSettings) -> None:
    """A lossy budget (max_accuracy_drop, min_cosine, mean_cosine) given to a run that makes only lossless
    candidates: nothing would read it, so it is refused (exit 2) naming the flag and what the run's candidates
    are held to."""
    if any(p != LOSSLESS for p in precisions):
        return
    given = [flag for flag, value in (("--max-accuracy-drop", settings.max_accuracy_drop),
                                      ("--min-cosine", settings.min_cosine),
                                      ("--mean-cosine", settings.mean_cosine),
                                      ("--min-agreement", settings.min_agreement),
                                      ("--min-token-agreement", settings.min_token_agreement),
                                      ("--max-kl", settings.max_kl)) if value is not None]  # fmt: skip
    if given:
        raise InputError(
            f"{', '.join(given)}: a budget of lossy candidates (fp16, int8), and this {hop} run makes only "
            f"{', '.join(precisions) or 'nothing'}, held to --atol, --rtol, --metric-tolerance; leave it out or ask "
            "for a lossy precision"
        )


def describe_held(hop: Hop, precision: str, task: str, has_target: bool, recorded: Mapping[str, Any],
                  detection: Detection | None = None) -> Policy:  # fmt: skip
    """The policy a recorded candidate was held to, chosen again from its stage's recorded settings.

    Records written before a setting existed hold no key for it: its default is taken. A budget that
    could not have been measured was refused when the stage ran, so it is left out here."""
    settings = GateSettings.read(recorded)
    try:
        return hop_policy(hop, precision, task, has_target, settings, detection)
    except InputError:  # a record edited by hand: read it as the stage's defaults would have judged it
        return hop_policy(hop, precision, task, has_target, GateSettings(), detection)
