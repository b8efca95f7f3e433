"""`pipe optimize`: graph optimization and quantization of an artifact's model into verified variants.

`graph.py` rewrites an ONNX file with onnxruntime's portable offline passes and onnxslim;
`quantize.py` (with `nodes.py` and `samples.py`) makes dynamic int8, static int8 (QDQ) and fp16 copies with
onnxruntime.quantization; `search.py` (with `sensitivity.py`) looks for the fastest variant within
an accuracy budget; `judge.py` holds each against model.onnx; `stage.py` is the stage itself
(recipe, verifier, records, reports). Variants are timed side by side by `pipeline/runtime/latency.py` and
calibrated on `pipeline/samples/calibration.py`'s samples, both below the stages (check and edge use them).
"""
