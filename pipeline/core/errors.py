"""One exception family. The CLI is the only place that turns these into exit codes."""

from __future__ import annotations


class PipelineError(Exception):
    """Base of every error pipe raises on purpose. Exit code 2: bad usage or bad input."""

    exit_code = 2


class InputError(PipelineError):
    """A value the user gave (a flag, a file, a recipe key) is wrong; the message names the fix."""


class RecipeError(InputError):
    """A recipe does not validate; the message lists each bad key by its dotted path."""


class ArtifactError(InputError):
    """An artifact directory is missing, malformed, tampered with or truncated."""


class CheckFailed(PipelineError):
    """A verification ran and found the model wrong (parity, regression). Exit code 1."""

    exit_code = 1


def first_line(exc: BaseException, limit: int = 300, empty: str | None = None) -> str:
    """An exception as one short line (onnxruntime and onnx messages can run to pages).

    An exception with no message gives `empty`, or its type's name when `empty` is None.
    """
    text = str(exc).strip()
    if not text:
        return type(exc).__name__ if empty is None else empty
    return text.splitlines()[0][:limit]
