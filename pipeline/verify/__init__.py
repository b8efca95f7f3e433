"""The verifier every stage checks its output with (export, import, optimize, edge, check).

Modules: `session` (the one onnxruntime session factory), `runners` (torch, onnxruntime, later
TFLite, all called as named arrays in -> named arrays out), `policies` (what "close enough" means
for a hop: exact, or a budget against the parent), `gate` (every check, one table, then exit 1),
`report` (the gate's rows and table), `metrics` (accuracy, MAE and which way is worse),
`evaluation` (an artifact's golden samples and the split its metric is measured on).

Nothing here imports torch, tensorflow or a stage package: the server loads this module.
"""
