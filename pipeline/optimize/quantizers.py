"""The quantizing kinds by the mode they convert, and `quantize`: a QuantSettings' file made by its kind.

The auto search, the benches and the tests quantize by settings alone; this is where a mode finds
the kind (int8_dynamic.py, int8_static.py, fp16.py) whose conversion makes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from pipeline.optimize.cache import QuantCache
from pipeline.optimize.calibration_feed import Progress
from pipeline.optimize.fp16 import FP16
from pipeline.optimize.int8_dynamic import INT8_DYNAMIC
from pipeline.optimize.int8_static import INT8_STATIC
from pipeline.optimize.quantize import Quantizer, QuantReport, QuantSettings

QUANTIZERS: dict[str, Quantizer] = {kind.mode: kind for kind in (INT8_DYNAMIC, INT8_STATIC, FP16)}


def quantize(
    src: Path,
    dst: Path,
    settings: QuantSettings,
    calibration: Mapping[str, np.ndarray] | None = None,
    scratch: Path | None = None,
    progress: Progress | None = None,
    cache: QuantCache | None = None,
) -> QuantReport:
    """Write a quantized copy of the model at `src` to `dst` as `settings` say (Quantizer.quantize), and report it."""
    return QUANTIZERS[settings.mode].quantize(src, dst, settings, calibration, scratch, progress, cache)
