"""An artifact's real samples, read the same way by every stage that judges or calibrates.

- `evaluation`: `evaluation_set(artifact, recipe)`: golden inputs and their recorded outputs, and the split
  the metric is measured on, with where it came from.
- `calibration`: `calibration_set`: the real samples static int8 (optimize) and full-integer int8 (edge)
  calibrate on; `has_real_samples`.
"""
