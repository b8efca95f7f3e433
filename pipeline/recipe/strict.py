"""The base of every recipe section: strict pydantic models (unknown keys, inf and NaN refused)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    # inf and NaN are refused wherever a number is expected: `lr: .inf` would train to NaN weights
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
