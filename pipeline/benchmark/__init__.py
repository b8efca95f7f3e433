"""`pipe benchmark ARTIFACT`: every format of one artifact timed side by side (see docs/benchmark.md).

`rows.py` decides what is timed (the rows), `sessions.py` loads each row in its runtime,
`run.py` times them in one interleaved run and records the result, `table.py` and `plot.py` show it.
"""
