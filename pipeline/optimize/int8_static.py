"""`int8-static`: calibrated QDQ int8 (onnxruntime's quantize_static), the int8 of conv nets on CPU.

Each activation's range is fixed from real samples (the artifact's training split, or the data given
at import: never made-up inputs), fed one batch per calibration pass (calibration_feed.py) so the
histogram calibrators stay bounded. A detector's decode tail stays fp32 (`float_tail`): one int8 scale
cannot hold pixel boxes beside 0..1 scores (nodes.decode_tail).
"""

from __future__ import annotations

import contextlib
import io

from onnxruntime.quantization import QuantFormat, quantize_static

from pipeline.optimize.calibration_feed import STRIDE, sample_reader
from pipeline.optimize.nodes import decode_tail
from pipeline.optimize.preprocess import quiet_advice
from pipeline.optimize.quantize import EXTRA_OPTIONS, METHODS, TYPES, Conversion, Quantizer, int8_options


class StaticInt8(Quantizer):
    name, precision, choice, mode = "int8-static", "int8", "static", "static"
    needs_samples = True

    def convert(self, step: Conversion) -> None:
        """Calibrate one batch per pass (STRIDE), into the cache's file for this method and graph when there is
        a cache, or read the ranges from it; then write the QDQ model."""
        settings, cache = step.settings, step.cache
        if settings.float_tail:  # named after pre-processing, which may fuse nodes
            step.tail = [name for name in decode_tail(step.model) if name not in step.excluded]
        calibration = dict(step.calibration or {})  # the frame refuses a calibrating kind without samples
        reader = sample_reader(step.model, calibration, step.samples, step.progress, step.warnings, step.out.parent,
                               step.axes)  # fmt: skip
        step.used = reader.samples
        kept = cache.ranges(settings.calibration, step.source) if cache is not None else None
        calibrates = kept is None or not kept.is_file()
        with quiet_advice(), contextlib.redirect_stdout(io.StringIO()):  # entropy/percentile calibrators print()
            quantize_static(
                step.source,
                step.out,
                reader,
                quant_format=QuantFormat.QDQ,
                activation_type=TYPES[settings.activation_type],
                calibrate_method=METHODS[settings.calibration],
                extra_options={**EXTRA_OPTIONS, **STRIDE},
                calibration_cache_path=kept,
                use_external_data_format=step.external,
                **int8_options(settings, [*step.excluded, *step.tail]),
            )
        if calibrates and cache is not None:
            cache.computed.append(settings.calibration)


INT8_STATIC = StaticInt8()
