"""`pipe run RECIPE`: the stages in order, each skipped while its output is up to date (`chain.py`)."""
