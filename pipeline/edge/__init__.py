"""`pipe export --target edge`: TFLite models of an artifact's model.onnx for phones and boards.

`convert.py` turns a copy of model.onnx into fp32, fp16 and full-integer int8 .tflite files with
onnx2tf in a child process (tensorflow never loads in pipe's own process); `stage.py` is the stage:
convert, judge each file with the verifier on LiteRT, run it on the device-like runtime through the
stand-alone runner (pipeline/runtime/tflite_runner.py), record the variants.
"""
