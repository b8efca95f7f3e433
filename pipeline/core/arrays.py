"""`Arrays`: named numpy arrays, the one shape every runner, protocol, gate and sample set passes around."""

from __future__ import annotations

import numpy as np

Arrays = dict[str, np.ndarray]  # tensor name -> array with a leading sample (batch) axis
