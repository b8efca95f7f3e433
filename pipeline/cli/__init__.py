"""The `pipe` command line: thin click commands over the stages, one module per command, named for it.

`group.py` holds the `main` group and the error handling every command shares (exit 0 ok, 1 a
check failed, 2 bad usage or bad input, 3 an internal error: one line, the trace in a file);
`params.py` the option types they share. `pipe train` is in `train.py`, `pipe export` in
`export.py`, and so on: train, import (`import_.py`: `import` is a Python keyword), export,
optimize, run, serve, promote, predict, info (its terminal views: `artifact_views.py`), check,
benchmark, report. Each command imports its stage inside its body, so `pipe --help` and
`pipe serve` never pay for torch or tensorflow.
"""

# importing them registers their commands on `main`
from pipeline.cli import (  # noqa: F401
    benchmark,
    check,
    export,
    import_,
    info,
    optimize,
    predict,
    promote,
    report,
    run,
    serve,
    train,
)
from pipeline.cli.group import main

__all__ = ["main"]
