"""`pipe export --target edge`: TFLite models of an artifact's model.onnx for phones and boards.

`convert.py` turns a copy of model.onnx into fp32, fp16 and full-integer int8 .tflite files with
onnx2tf in a child process (tensorflow never loads in pipe's own process); `scaling.py` moves what
int8's one scale per tensor cannot hold out of the copy converted (a detector's pixel boxes, a
tabular model's leading normalization); `fp16range.py` names a value fp16 cannot hold; `feeding.py`
writes what a device program needs beside the files (feeding.json, labels.txt, TFLite metadata);
`device.py` runs each file on the device-like runtime through the stand-alone runner
(pipeline/runtime/tflite_runner.py); `stage.py` is the stage: convert, judge each file with the
verifier on LiteRT, check it on the device runtime, record the variants.
"""
