"""Labelled text pictures made in the test: known words and numbers rendered with PIL in the fonts on this
machine, as PaddleOCR's recognizer takes them (BGR, height 48, width 320 with the text's right padded).

`texts(n)` are the words; `picture(text, font)` one picture of it; `tensor(pictures)` the model's input
[n, 3, 48, 320] made the way rapidocr's `TextRecognizer.resize_norm_img` makes it ((x / 255 - 0.5) / 0.5,
channels in BGR order, zeros right of the text); `reference_texts` the greedy CTC decoding of onnxruntime's
output written plainly here (argmax, merge repeats, drop the blank), what the served texts must equal.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

HEIGHT, WIDTH = 48, 320
WORDS = ["hello", "world", "pipeline", "model", "server", "Python", "numpy", "invoice", "total", "open",
         "data", "green", "river", "coffee", "station", "number"]  # fmt: skip
FONTS = ("DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf", "DejaVuSans-Bold.ttf")


def texts(count: int = 64) -> list[str]:
    """`count` texts: words, numbers and a few two-word texts (spaces), each used with each font in turn."""
    rng = np.random.default_rng(0)
    made = []
    for i in range(count):
        kind = i % 4
        if kind == 0:
            made.append(WORDS[i // 4 % len(WORDS)])
        elif kind == 1:
            made.append(str(int(rng.integers(10, 99_999))))
        elif kind == 2:
            made.append(f"{WORDS[(i * 7) % len(WORDS)]} {int(rng.integers(1, 999))}")
        else:
            made.append(WORDS[(i * 3) % len(WORDS)].upper())
    return made


@functools.cache
def _font(name: str, size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    for folder in (Path("/usr/share/fonts/truetype/dejavu"), Path("/usr/share/fonts/TTF")):
        if (folder / name).is_file():
            return ImageFont.truetype(str(folder / name), size)
    return ImageFont.load_default(size=size)  # PIL's own font, where no DejaVu is installed


def picture(text: str, font: str = FONTS[0]) -> Image.Image:
    """Black text on white, height 48, as wide as the text with a margin (at most 320)."""
    face = _font(font, 30)
    left, top, right, bottom = ImageDraw.Draw(Image.new("RGB", (1, 1))).textbbox((0, 0), text, font=face)
    width = min(WIDTH, right - left + 16)
    image = Image.new("RGB", (width, HEIGHT), "white")
    ImageDraw.Draw(image).text((8 - left, (HEIGHT - (bottom - top)) // 2 - top), text, fill="black", font=face)
    return image


def pictures(count: int = 64) -> tuple[list[str], list[Image.Image]]:
    words = texts(count)
    return words, [picture(text, FONTS[i % len(FONTS)]) for i, text in enumerate(words)]


def tensor(images: list[Image.Image]) -> np.ndarray:
    """[n, 3, 48, 320] float32 as rapidocr feeds PP-OCR: BGR, (x / 255 - 0.5) / 0.5, zero padding on the right."""
    out = np.zeros((len(images), 3, HEIGHT, WIDTH), np.float32)
    for i, image in enumerate(images):
        bgr = np.asarray(image.convert("RGB"), np.float32)[:, :, ::-1]
        out[i, :, :, : bgr.shape[1]] = ((bgr / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)
    return out


def reference_texts(model: Path, batch: np.ndarray) -> list[str]:
    """The texts onnxruntime's output of the original file reads as, decoded plainly: argmax per position,
    repeats merged, blank (class 0) dropped, class i the dictionary's line i - 1, the last class a space."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    table = ["<blank>", *session.get_modelmeta().custom_metadata_map["character"].splitlines(), " "]
    scores = session.run(None, {session.get_inputs()[0].name: batch})[0]
    read = []
    for row in scores.argmax(axis=2):
        previous, chars = -1, []
        for index in row.tolist():
            if index != previous and index != 0:
                chars.append(table[index])
            previous = index
        read.append("".join(chars))
    return read
