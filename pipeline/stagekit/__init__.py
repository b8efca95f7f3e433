"""The stage contract every stage package follows, so a reader who knows one stage knows all.

- `contract`: `Stage` (name, `fresh`, `run`, `off`, `judges`), the `Context` a `pipe run` hands each stage,
  `Progress` (the one progress callback, always the parameter `progress`) and `Overrides` (the one overrides
  type: command-line values keyed like the stage's recipe section).
- `opening`: `open_for_model` (a stage that works from model.onnx opens its artifact one way: resolve,
  load with its own outputs left out of the check, refuse a missing model.onnx or a `--recipe` on an
  imported model, read its recipe section with the overrides on top, the evaluation set) and
  `made_from_model_fresh` (such a stage is up to date while its record has these settings, this model.onnx
  and every variant it made).
- `model_record`: `record_model`, how a stage that makes model.onnx (export, every import) records it: its
  external data files hashed, the fp32 variant with the size of both.

Every stage package has `stage.py` with its entry function `<stage>_artifact(path, overrides=None,
recipe_path=None, progress=print)` (train: `train_recipe`) and `STAGE`, what `pipe run` reads.
"""
