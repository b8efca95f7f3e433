"""Defaults a recipe section declares and a command's help or a library call repeats: each written once here.

Plain constants, no pydantic: `pipe --help` reads them without loading the schema.
"""

from __future__ import annotations

# optimize.search_seconds: the auto search starts no new candidate after this many seconds; the best so far is kept
SEARCH_SECONDS = 120.0
# optimize.max_exclusions: the nodes the auto search may leave in fp32 to meet the budget
MAX_EXCLUSIONS = 8
# optimize.quantize and `pipe optimize --quantize`: the choices, one per variant kind asked by it (optimize/kinds.py)
QUANTIZE_CHOICES = ("dynamic", "static", "fp16", "auto", "int8-weights", "int4-weights")
# the choices a decoder (text-generation) is made with: weight-only, activations fp32 (auto: the smallest within budget)
DECODER_CHOICES = ("int8-weights", "int4-weights")
