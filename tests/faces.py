"""Drawn faces a real face detector finds: the evaluation data for NudeNet's YOLOv8n (tests/corpus.py NUDENET).

NudeNet's detector has a face class; on these pictures (a flat colour, coloured shapes, skin-coloured
ellipses, and one face: a skin ellipse with two eyes and a mouth) it finds faces at scores 0.25-0.6, so a
lossy hop's box agreement has boxes to measure. Measured with onnxruntime at the box budget's confidence
0.25: 24 pictures at the default radius 50 hold 11 boxes; 64 pictures at radius 80 hold 50 boxes in 46
pictures (the bench's data). Smaller faces, several faces a picture, or hair around the face give fewer boxes, not more.

Used by tests/edge/test_edge_real_detector.py and bench/bench_real_models.py (one drawing, not two).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

SKIN, FACE, EYE, MOUTH = (224, 172, 140), (230, 180, 150), (40, 30, 20), (150, 50, 50)


def drawn_faces(root: Path, count: int = 24, radius: int = 50) -> Path:
    """`count` 320x320 PNGs in `root` (made here): six shapes on a flat colour, then a face `radius` wide (and
    1.3 times that high) at a random centre; the same seed, so the same pictures, every call."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    for k in range(count):
        image = Image.new("RGB", (320, 320), tuple(int(v) for v in rng.integers(0, 255, 3)))
        draw = ImageDraw.Draw(image)
        for j in range(6):
            x, y = rng.integers(0, 280, 2)
            w, h = rng.integers(20, 160, 2)
            colour = SKIN if j % 2 else tuple(int(v) for v in rng.integers(0, 255, 3))
            (draw.ellipse if j % 2 else draw.rectangle)([x, y, x + w, y + h], fill=colour)
        cx, cy = (int(v) for v in rng.integers(80, 240, 2))
        face(draw, cx, cy, radius)
        image.save(root / f"{k:02d}.png")
    return root


def face(draw: ImageDraw.ImageDraw, cx: int, cy: int, r: int) -> None:
    """A face centred at (cx, cy): a skin ellipse r wide and 1.3 r high, two dark eyes, a red mouth."""
    draw.ellipse([cx - r, cy - round(1.3 * r), cx + r, cy + round(1.3 * r)], fill=FACE)
    eye_top, eye_bottom, inner, outer = cy - round(0.4 * r), cy - round(0.2 * r), round(0.2 * r), round(0.5 * r)
    draw.ellipse([cx - outer, eye_top, cx - inner, eye_bottom], fill=EYE)
    draw.ellipse([cx + inner, eye_top, cx + outer, eye_bottom], fill=EYE)
    draw.arc([cx - outer, cy + inner, cx + outer, cy + round(0.8 * r)], 0, 180, fill=MOUTH, width=max(2, r // 12))
