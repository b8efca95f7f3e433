"""`pipe serve`: an onnxruntime HTTP server speaking KServe V2 (with binary tensors) and TF Serving REST.

Seams: `scan` finds version directories, `variant_choice` picks each version's variant file,
`repository` verifies and loads them (and hot reloads), `session` wraps an onnxruntime session and
its I/O specs, `batching` groups requests into one run, `protocols/` turn HTTP bodies into named
numpy arrays and back (one `Protocol` contract), `routes` is the table of every route (dispatch and
`openapi` both read it), `app` answers them and maps errors, `body`, `auth`, `metrics` and
`access_log` wrap it (body limit, API key, response counts, access log), `server` runs uvicorn.
Nothing here imports torch or tensorflow.
"""
