"""The gate settings a hop's recipe section takes: what its candidates are held to.

Every hop that makes a file (export, optimize, edge; import takes the same on its command line)
declares these by deriving its section from one of the two bases, so a setting means the same in
every section; `pipeline/verify/choose.py:hop_policy` is the one place that reads them.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from pipeline.recipe.strict import Strict


class LosslessGate(Strict):
    """A hop whose candidate must compute what its reference computes (export, import, a graph pass, fp32)."""

    atol: float = Field(1e-4, gt=0)  # per-element absolute difference allowed (plus rtol * |reference|)
    rtol: float = Field(1e-3, ge=0)  # plus this fraction of the reference's magnitude
    metric_tolerance: float = Field(1e-3, ge=0)  # the task metric: |candidate - reference| allowed
    # the share of an output's values allowed out of tolerance (none beyond 10x it): 2 of 4,240,000 values of a
    # real recognizer's fp32 TFLite were just past 1e-4, its texts identical; a broken conversion moves far more
    max_out_of_tolerance: float = Field(1e-4, ge=0, le=1)

    @model_validator(mode="before")
    @classmethod
    def _gone(cls, given: Any) -> Any:
        """Keys of an older schema, refused with what replaced them rather than as unknown."""
        if isinstance(given, dict) and "atol_fp16" in given:
            raise ValueError(
                "atol_fp16 is gone: fp16 is lossy and judged by the task's budget over the evaluation split "
                "(max_accuracy_drop, min_cosine), never element by element; remove atol_fp16"
            )
        return given


class Gate(LosslessGate):
    """A hop that makes lossless and lossy candidates (optimize, edge): the lossy ones meet a budget."""

    # the task metric's drop, in its units; None: the hop's default (1 accuracy point for optimize, 1.5 for
    # edge's int8 classifier; 1% relative error for regression, never a fixed amount of the target's units)
    max_accuracy_drop: float | None = Field(None, ge=0)
    # embeddings, and tensor outputs whose rows are unit vectors: each row's cosine to the reference, the worst
    # row's least (None: 0.9) and the rows' mean least (None: 0.99; docs/gates.md "Embeddings")
    min_cosine: float | None = Field(None, gt=0, le=1)
    mean_cosine: float | None = Field(None, gt=0, le=1)
    # classifiers without targets (top-1 agreement; None: 0.99) and text recognizers (text agreement; None: 0.95):
    # the least share of samples answered as the reference answers them
    min_agreement: float | None = Field(None, gt=0, le=1)
    # decoders (text-generation), teacher-forced on held-out text: the share of next tokens chosen as the reference
    # chooses them, and the mean KL from its next-token distribution (nats per token); None: 0.90 and 0.05
    min_token_agreement: float | None = Field(None, ge=0, le=1)
    max_kl: float | None = Field(None, ge=0)
