"""`pipe check`: the CI model-regression gate, a candidate artifact against a baseline (see docs/check.md)."""
