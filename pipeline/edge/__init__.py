"""`pipe export --target edge`: TFLite models of an artifact's model.onnx for phones and boards.

`convert.py` turns a copy of model.onnx into fp32, fp16 and full-integer int8 .tflite files with
onnx2tf in a child process (tensorflow never loads in pipe's own process); `runner.py` runs a
.tflite file with named numpy arrays on LiteRT or tflite-runtime and imports nothing else of pipe,
so a device can copy it; `stage.py` is the stage: convert, judge each file with the verifier,
record the variants. This file stays free of imports: importing `runner.py` runs it.
"""
