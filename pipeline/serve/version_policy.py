"""Which versions of a model `pipe serve` serves, and which one an unversioned request reaches.

`--versions` (Triton's version policy, TF Serving's labels):
- `all` (the default): every version that loads;
- `checked`: only versions whose check passed (the manifest's `stages.check.passed`, recorded by
  `pipe run` against the baseline committed beside the recipe); a version is held back until its
  check passes, and loads on the next scan after it does;
- `promoted`: only versions a label names (`pipe promote`, pipeline/artifact/labels.py).
`--latest N` then keeps the newest N of those.

A request naming no version reaches the version labelled `stable` when the model has that label,
else the newest served version. So with labels, a new version directory is served by number (and
by `canary`, say) but never takes unversioned traffic until it is promoted.
"""

from __future__ import annotations

from pipeline.artifact.directory import Artifact
from pipeline.artifact.labels import STABLE
from pipeline.core.errors import ArtifactError

POLICIES = ("all", "checked", "promoted")


class HeldBack(ArtifactError):
    """A sound version the policy does not serve (yet): a step to take (`pipe run`, `pipe promote`), not a fault."""


def admit(policy: str, artifact: Artifact) -> None:
    """Raise HeldBack when `policy` does not serve this loaded version for what its manifest says."""
    if policy != "checked":
        return
    record = artifact.manifest.stages.check
    if record is None:
        raise HeldBack(
            f"--versions checked: {artifact.root} has no check record; `pipe run` its recipe with the baseline "
            "committed beside it (models/NAME.baseline.json) and it is served once that check passes"
        )
    if not record.passed:
        failed = "; ".join(record.failures[:3]) or "see its check report"
        raise HeldBack(f"--versions checked: the check of {artifact.root} failed ({failed}); it is not served")


def held_by_labels(policy: str, version: int, labels: dict[str, int]) -> str | None:
    """Why `policy` does not serve `version` given the model's labels; None when it may be served."""
    if policy != "promoted" or version in labels.values():
        return None
    named = ", ".join(f"{label}: v{v}" for label, v in sorted(labels.items())) or "none"
    return (
        f"--versions promoted: v{version} has no label (labels: {named}); `pipe promote` it "
        "(e.g. `pipe promote artifacts/NAME/N --label canary`) to serve it"
    )


def default_version(served: list[int], labels: dict[str, int]) -> tuple[int | None, str | None]:
    """The version an unversioned request reaches: (the version, None), or (None, why not) when the `stable`
    label names a version that is not served (it is never silently replaced by the newest)."""
    stable = labels.get(STABLE)
    if stable is None:
        return max(served), None
    if stable in served:
        return stable, None
    return None, f"its {STABLE!r} label names v{stable}, which is not served"
