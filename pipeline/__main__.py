"""`python -m pipeline` is the same as the `pipe` command."""

from pipeline.cli import main

main(prog_name="pipe")
