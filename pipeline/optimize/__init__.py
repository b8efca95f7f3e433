"""`pipe optimize`: graph optimization and quantization of an artifact's model into verified variants.

`stage.py` loops over `kinds.py`'s `KINDS`, one unit per variant kind (`kind.py`): `opt.py`
(onnxruntime's portable passes and onnxslim, `graph.py`), `int8_dynamic.py`, `int8_static.py` and
`fp16.py` (onnxruntime's tools, through the frame they share in `quantize.py`, with `nodes.py`,
`calibration_feed.py` and `cache.py`), and `int8_auto.py`, the search for the fastest int8 variant
within an accuracy budget (`search.py`: `plan.py` chooses its candidates by what the graph holds,
`speed.py` times them beside fp32 a few at a time, `profile.py` says why a kept model is not faster,
and `repair.py` with `sensitivity.py` leaves in fp32 the nodes that break the budget); `judge.py`
holds each against model.onnx. Variants are timed side by side by `pipeline/runtime/latency.py` and
calibrated on `pipeline/samples/calibration.py`'s samples, both below the stages.
"""
