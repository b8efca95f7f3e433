"""`pipe optimize`: graph optimization and quantization of an artifact's model into verified variants.

`graph.py` rewrites an ONNX file with onnxruntime's portable offline passes and onnxslim;
`quantize.py` makes dynamic int8, static int8 (QDQ) and fp16 copies with onnxruntime.quantization;
`measure.py` times variants side by side; `search.py` looks for the fastest variant within an
accuracy budget; `stage.py` is the stage itself (recipe, verifier, records, reports).
"""
