"""`pipe optimize`: graph optimization and quantization of an artifact's model into verified variants.

`graph.py` rewrites an ONNX file with onnxruntime's portable offline passes and onnxslim;
`quantize.py` (with `nodes.py`, `samples.py` and `cache.py`) makes dynamic int8, static int8 (QDQ) and
fp16 copies with onnxruntime.quantization; `search.py` looks for the fastest int8 variant within an
accuracy budget: `plan.py` chooses its candidates by what the graph holds, `speed.py` times them
beside fp32 a few at a time, `profile.py` says why a kept model is not faster, and `repair.py` (with
`sensitivity.py`) leaves in fp32 the nodes that break the budget; `judge.py` holds each against
model.onnx; `stage.py` is the stage itself (recipe, verifier, records, reports). Variants are timed
side by side by `pipeline/runtime/latency.py` and calibrated on `pipeline/samples/calibration.py`'s
samples, both below the stages (check and edge use them).
"""
