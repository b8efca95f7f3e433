"""A version as the server holds it: its session, batcher and what its manifest says about answering.

`Repository` (repository.py) loads and swaps these; the protocols and handlers read them. A version's
manifest is re-read when its stamp changes (`stamp`: an atomic rewrite gives a new inode or mtime).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from pipeline.artifact.manifest import MANIFEST_NAME, Manifest
from pipeline.serve.batching import Batcher
from pipeline.serve.detections import OUTPUTS as DETECTIONS
from pipeline.serve.detections import Detector
from pipeline.serve.errors import RequestError
from pipeline.serve.generation.served import TextGenerator
from pipeline.serve.images import ServedImages
from pipeline.serve.protocols.base import ModelIO
from pipeline.serve.recognition import OUTPUTS as TEXTS
from pipeline.serve.recognition import Recognizer
from pipeline.serve.session import ModelSession
from pipeline.serve.text import ServedText
from pipeline.serve.variant_choice import Choice

Stamp = tuple[int, int, int]  # a manifest file's (inode, mtime_ns, size): an atomic rewrite changes it
VERSION_DIGITS = 9  # the longest version directory name (pipeline.artifact.directory.is_version_name)


@dataclass(frozen=True)
class Answers:
    """What a version's manifest says about answering requests, beyond its model file."""

    images: ServedImages  # which inputs take encoded pictures, and how
    task: str
    detector: Detector | None  # task detection only
    text: ServedText = field(default_factory=ServedText)  # a model with a tokenizer: how it takes text
    recognizer: Recognizer | None = None  # task text-recognition only: how its output reads as text

    @classmethod
    def of(cls, manifest: Manifest, root: Path) -> Answers:
        return cls(ServedImages.of(manifest), manifest.task, Detector.of(manifest), ServedText.of(root, manifest),
                   Recognizer.of(manifest))  # fmt: skip


@dataclass
class LoadedVersion:
    """A verified artifact version with its session and batcher, ready for requests."""

    name: str
    version: int
    root: Path
    choice: Choice
    session: ModelSession
    batcher: Batcher
    stamp: Stamp  # the manifest's stamp when it was last read
    reload_error: str | None = None  # why the manifest's latest change was refused (this keeps serving)
    images: ServedImages = field(default_factory=ServedImages)  # which inputs take encoded pictures, and how
    task: str = "classification"  # the manifest's task
    detector: Detector | None = None  # task detection: how the head output becomes boxes
    text: ServedText = field(default_factory=ServedText)  # a model with a tokenizer: how it takes text
    recognizer: Recognizer | None = None  # task text-recognition: how its output reads as text
    generator: TextGenerator | None = None  # task text-generation: the engine, tokenizer and chat template

    def read(self, answers: Answers) -> None:
        """Take what the manifest says about answering requests (read again when the manifest changes)."""
        self.images, self.task, self.detector = answers.images, answers.task, answers.detector
        self.text, self.recognizer = answers.text, answers.recognizer
        self.__dict__.pop("io", None)  # the text input and a recognizer's outputs are part of what protocols see

    async def close(self) -> None:
        """Answer what it accepted, then stop."""
        await self.batcher.close()
        if self.generator is not None:
            await self.generator.engine.close()

    @property
    def variant(self) -> str:
        return self.choice.variant

    @property
    def file(self) -> str:
        return self.choice.file

    @cached_property
    def io(self) -> ModelIO:
        """Name, version and tensor specs: what the protocols see of this version."""
        text = self.text.spec()
        inputs = [text, *self.session.inputs] if text is not None else self.session.inputs
        read = self.recognizer.specs() if self.recognizer is not None else []  # a recognizer's text outputs
        max_rows = self.batcher.settings.max_batch_size if self.session.batchable else None
        pinned = frozenset(self.session.pinned)
        return ModelIO(self.name, self.version, inputs, [*read, *self.session.outputs], max_rows, pinned)

    def output_names(self, asked: list[str] | None, detections: bool = False) -> list[str]:
        """The outputs to answer with, in order: those asked for (each must exist), else every output; with
        detections, the detections outputs by default, and the raw ones by name too (a detections output's
        name wins over a raw output of the same name); a text recognizer's `text` and `confidence` likewise."""
        valid = [s.name for s in self.session.outputs]
        if detections:
            valid = [*DETECTIONS, *(name for name in valid if name not in DETECTIONS)]
        elif self.recognizer is not None:  # a recognizer answers text by default, its raw output by name
            valid = [*TEXTS, *(name for name in valid if name not in TEXTS)]
            if asked is None:
                return list(TEXTS)
        if asked is None:
            return list(DETECTIONS) if detections else valid
        unknown = sorted(set(asked) - set(valid))
        if unknown:
            raise RequestError(f"unknown output(s) {unknown} requested; the model's outputs are {valid}")
        return asked


def version_number(text: str) -> int | None:
    """A version from a URL: ASCII digits only ('²' is a digit to Python, and int('²') fails), and no
    longer than a version directory's name (int() refuses 4,300 digits or more)."""
    digits = text.lstrip("0")
    return int(text) if text.isascii() and text.isdigit() and len(digits) <= VERSION_DIGITS else None


def manifest_stamp(root: Path) -> Stamp:
    st = (root / MANIFEST_NAME).stat()
    return st.st_ino, st.st_mtime_ns, st.st_size
