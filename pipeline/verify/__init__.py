"""The verifier every stage checks its output with (export, import, optimize, edge, check).

Modules: `policies` (what "close enough" means for a hop: exact, or a budget against the parent),
`gate` (every check, one table, then exit 1), `report` (the gate's rows and table), `metrics`
(accuracy, MAE). The runners it drives live in pipeline/runtime/, the samples it judges on in
pipeline/samples/.

Nothing here imports torch, tensorflow or a stage package: the server loads this module.
"""
