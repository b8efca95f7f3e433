"""Running models, shared below every stage: every runtime called one way (named arrays in and out).

- `session`: `create_session`, the one onnxruntime session factory (providers, threads, one-line load errors).
- `runners`: `OrtRunner`/`ort_runner`, `torch_runner`, `tflite_candidate`, `run_chunked`.
- `tflite_runner`: the stand-alone TFLite runner (numpy and a LiteRT / tflite-runtime interpreter, nothing of
  pipe), copied to devices alone and run as a script by the device-like check.
- `latency`: several models timed side by side, interleaved, in one run.
- `backends`: the training-backend seam, `backend_for(artifact)`: the trained model, example inputs and a
  reference runner, the backend's module imported by path so no stage imports the training code.
- `images`: a picture into a model's input as it was trained (the recorded image preprocessing).
"""
