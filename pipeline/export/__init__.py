"""Export: torch -> model.onnx behind a parity gate, `pipe import` for ONNX made elsewhere, Triton repositories.

Modules: `onnx_export` (the torch exporters), `opset` (which operator an opset lacks), `metadata`
(identity stamped into model.onnx), `stage` (`pipe export`), `importer` (`pipe import`), `triton`
(`pipe export --target triton`). The gate itself is the shared verifier, `pipeline.verify`.
"""
