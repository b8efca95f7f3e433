"""The stage contract every stage package follows (see `contract.py`)."""
