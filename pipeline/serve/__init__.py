"""`pipe serve`: an onnxruntime HTTP server speaking KServe V2 (with binary tensors) and TF Serving REST.

Seams: `repository` finds and loads artifacts (versions, variants, hot reload), `session` wraps an
onnxruntime session and its I/O specs, `batching` groups requests into one run, `protocols/` turn
HTTP bodies into named numpy arrays and back, `app` routes, checks and maps errors, `server` runs
uvicorn. Nothing here imports torch or tensorflow.
"""
