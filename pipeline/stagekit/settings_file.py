"""A settings file: a hop's settings for any artifact, imported or trained, kept beside the command line.

    pipe export artifacts/ocr --target edge --settings gates.yaml
    pipe optimize artifacts/ocr --settings gates.yaml --max-accuracy-drop 0.02

The file is YAML with one section per hop, each the section a recipe has for it (docs/recipes.md), so a
tolerance or budget means the same in a recipe, a settings file and on the command line:

    import:   {atol: 1e-4, rtol: 1e-3, metric_tolerance: 1e-3, max_out_of_tolerance: 1e-4}
    export:   {atol: 1e-4, opset: 18}
    optimize: {max_accuracy_drop: 0.02, quantize: [dynamic]}
    edge:     {atol: 2e-4, max_accuracy_drop: 0.03, precisions: [fp32, fp16]}

Every section the file has is validated (a typo in another hop's section is found now, not when that hop
runs), each problem named by the file and its dotted key; a command reads its own section only. The
values it gives sit on top of the recipe's section (or its defaults, for an imported model) and below
the command line's flags. An imported model has no recipe (`--recipe` is refused for it): this is
where its settings live.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from pipeline.core.errors import InputError
from pipeline.recipe.file import duplicate_keys
from pipeline.recipe.gates import LosslessGate
from pipeline.recipe.schema import EdgeSpec, ExportSpec, OptimizeSpec
from pipeline.recipe.strict import Strict

# the hops a settings file has a section for, and each section's schema (import takes the lossless gate only)
SECTIONS: dict[str, type[Strict]] = {
    "import": LosslessGate,
    "export": ExportSpec,
    "optimize": OptimizeSpec,
    "edge": EdgeSpec,
}


def read_settings(path: str | Path, hop: str) -> dict[str, Any]:
    """The `hop` section of the settings file at `path`: the keys it gives, validated; {} when it has none.

    Raises InputError (exit 2) for a missing or malformed file, an unknown section, or a bad value in any
    section, naming the file and the dotted key."""
    if hop not in SECTIONS:
        raise InputError(f"no settings section for {hop!r}; a settings file has {', '.join(SECTIONS)}")
    path = Path(path)
    if not path.is_file():
        raise InputError(f"--settings {path}: no such file; give a YAML file with sections {', '.join(SECTIONS)}")
    text = path.read_bytes()
    try:
        duplicates = duplicate_keys(yaml.compose(text, Loader=yaml.SafeLoader))
        raw = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError) as exc:
        raise InputError(f"--settings {path} is not valid YAML: {' '.join(str(exc).split())[:300]}") from None
    if duplicates:
        raise InputError(f"--settings {path} is invalid: " + "; ".join(duplicates))
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise InputError(f"--settings {path}: expected sections ({', '.join(SECTIONS)}), got a {type(raw).__name__}")
    unknown = sorted(str(k) for k in raw if k not in SECTIONS)
    if unknown:
        raise InputError(
            f"--settings {path}: unknown section(s) {', '.join(unknown)}; the sections are {', '.join(SECTIONS)}"
        )
    problems: list[str] = []
    given: dict[str, dict[str, Any]] = {}
    for section, values in raw.items():
        values = {} if values is None else values
        if not isinstance(values, dict):
            problems.append(f"{section}: expected a mapping of settings, got {values!r}"[:200])
            continue
        try:
            read = SECTIONS[section].model_validate(values)
        except ValidationError as exc:
            for err in exc.errors():
                key = ".".join(str(part) for part in (section, *err["loc"]))
                problems.append(f"{key}: {err['msg']} (got {err.get('input')!r})"[:300])
            continue
        given[section] = read.model_dump(include=read.model_fields_set)  # by field name: edge.atol_fp32 is atol
    if problems:
        raise InputError(f"--settings {path} is invalid: " + "; ".join(problems))
    return dict(given.get(hop, {}))


def layered(path: str | Path | None, hop: str, flags: dict[str, Any]) -> dict[str, Any]:
    """The `hop`'s overrides: the settings file's section (when given) with the command line's values on top
    (a flag left out, None, keeps the file's value)."""
    base = read_settings(path, hop) if path is not None else {}
    return {**base, **{k: v for k, v in flags.items() if v is not None}}
