"""The `pipe` command line: thin click commands over the stages, one module per kind of command.

`group.py` holds the `main` group and the error handling every command shares (exit 0 ok, 1 a
check failed, 2 bad usage or bad input, 3 an internal error: one line, the trace in a file);
`make.py` the commands that make an artifact (train, import, export, optimize, run), `ship.py`
those that use one (serve, predict, info) and `judge.py` those that judge one (check, benchmark,
report). Each command imports its stage inside its body, so `pipe --help` and `pipe serve` never
pay for torch or tensorflow.
"""

from pipeline.cli import judge, make, ship  # noqa: F401  (importing them registers their commands on `main`)
from pipeline.cli.group import main

__all__ = ["main"]
