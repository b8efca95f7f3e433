"""The class names a user gives `pipe import`: `--labels a,b,c` or `--labels-file` (one per line).

(The labels a served model's versions carry, `labels.json`, are another thing: pipeline/artifact/labels.py.)
"""

from __future__ import annotations

from pathlib import Path

from pipeline.artifact.manifest import label_problem
from pipeline.core.errors import InputError


def read_class_names(inline: str | None, file: Path | None) -> list[str]:
    """Class names from `--labels a,b,c` or `--labels-file` (one per line); blank or repeated names are refused."""
    if inline and file:
        raise InputError("pass --labels or --labels-file, not both")
    if file is not None:
        if not file.is_file():
            raise InputError(f"labels file {file} not found; pass a text file with one class name per line")
        try:
            text = file.read_text(encoding="utf-8").removeprefix("\ufeff")  # a byte-order mark some editors write
            names = [line.strip() for line in text.splitlines()]
        except UnicodeDecodeError as exc:
            raise InputError(f"labels file {file} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        while names and not names[-1]:  # blank lines at the end name nothing
            names.pop()
        if "" in names:  # dropping it would shift every class after it by one
            raise InputError(
                f"labels file {file}, line {names.index('') + 1} is empty or white space; a class name is one line of "
                "text, one per class in output order (a text recognizer's dictionary, whose space lines are entries, "
                "imports with --task text-recognition)"
            )
    else:
        names = [s.strip() for s in inline.split(",")] if inline else []
        if "" in names:
            raise InputError(f"--labels {inline!r} has an empty class name; give names separated by single commas")
    if problems := [p for p in map(label_problem, names) if p]:
        where = f"labels file {file}" if file is not None else "--labels"
        raise InputError(f"{where}: {problems[0]}; give plain names")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise InputError(f"class names must be distinct; repeated: {', '.join(repeated)}")
    return names
