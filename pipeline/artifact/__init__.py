"""The artifact, the spine every stage reads and writes (docs/artifact.md).

- `directory`: `Artifact` (a version directory: load with verification, atomic save), `resolve_artifact`,
  `version_dirs` (the one scan of version directories), `locked` (the lock file).
- `manifest`: the manifest dataclasses (`FileEntry`, `Lineage`, `Manifest`) and their checks.
- `tensors`: `TensorSpec`, one input or output, and what it carries (`Feature`, `TokenInput`); below the
  manifest and the modules that read specs (`preprocessing`, `tokens`, `dims`).
- `checks`: the field checks the dataclasses share.
- `records`: typed stage records (`StageRecord`, `TrainRecord`, `ExportRecord`, ...) and `Stages`.
- `variants`: `variant_file`, the one mapping of a variant name to its file, and the `Variant` record.
- `golden`: `golden.npz`, the real inputs and reference outputs every later hop is checked against.
- `stagewrite`: `StageWrite`, how a stage commits into a version (scratch -> gate -> move -> record -> save).
- `directions`: which way each recorded metric improves (`HIGHER_IS_BETTER`, `metric_drop`).
- `datatypes`: the datatype tables (manifest/numpy <-> KServe V2 <-> onnxruntime <-> TF Serving).

Nothing here imports a stage, torch or tensorflow: the server loads it. The modules stand in layers
(pyproject's `artifact-layers` contract), so no two of them import each other.
"""
