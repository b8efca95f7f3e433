"""The `pipe` command group, and the one place that turns an error into a message and an exit code.

Exit 0 ok, 1 a check failed, 2 bad usage or bad input, 3 an internal error (any other exception:
one line, the full trace written to a file).
"""

from __future__ import annotations

import sys
from typing import Any

import click

from pipeline import __version__
from pipeline.core.errors import PipelineError, first_line

INTERNAL_ERROR = 3  # exit code of an exception pipe did not raise on purpose (a bug, or one not yet handled)


class PipeGroup(click.Group):
    """A click group that reports PipelineErrors as one clear message and the right exit code.

    Any other exception is ours to fix, not the user's to read: one line naming it and the file
    holding its full trace, exit 3. Click's own exceptions (usage errors, --help) and
    KeyboardInterrupt pass through as click handles them.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PipelineError as exc:
            click.secho(f"error: {exc}", err=True, fg="red")
            sys.exit(exc.exit_code)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            where = _write_trace()
            message = first_line(exc, empty="")
            click.secho(
                f"error: internal error: {type(exc).__name__}: {message} (full trace: {where})", err=True, fg="red"
            )
            sys.exit(INTERNAL_ERROR)


def _write_trace() -> str:
    """The current exception's trace, written to a new file under the temp directory; its path, or why not."""
    import tempfile
    import traceback

    try:
        handle, path = tempfile.mkstemp(prefix="pipe-trace-", suffix=".txt")
        with open(handle, "w", encoding="utf-8") as out:
            out.write(f"pipe {__version__}: {' '.join(sys.argv)}\n\n{traceback.format_exc()}")
    except OSError as exc:
        return f"not written: {exc}"
    return path


@click.group(cls=PipeGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pipe")
def main() -> None:
    """pipe: train a model, export it once to ONNX, verify, optimize, serve and ship it."""
