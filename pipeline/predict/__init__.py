"""`pipe predict`: local inference on one variant of an artifact, for a quick look.

Not a stage: it writes nothing. `inputs` reads an .npz, a JSON file or an image into named arrays
checked against the manifest's input specs (`image` converts a picture the way the model was
trained on); `model` chooses the variant and runs it (onnxruntime through the one session factory,
TFLite through the edge runner); `result` turns the outputs into top-k labels or arrays, as text or
JSON; `run.predict_file` chains them.
"""
