"""What `pipe import` records for a CTC text recognizer (task `text-recognition`): its dictionary and convention.

A recognizer's one output is [batch, positions, classes]; its dictionary names every class but the
blank (pipeline/runtime/ctc.py). Where the dictionary comes from, flags first:

- `--labels-file FILE` with `--task text-recognition`: one entry per line, kept verbatim (only the
  line break is removed): an empty line, a space or an ideographic space (U+3000) is an entry
  like any other, and dropping one would shift every class after it;
- PaddleOCR's `metadata_props['character']` (pipeline/export/conventions.py): its lines, every one
  kept (an empty or a repeated line too, as PaddleOCR's own decoder keeps them). A model
  whose first output is [batch, positions, classes] with classes = lines + 1 or + 2 is taken as a
  recognizer without `--task` (a Paddle classifier's [batch, classes] output is not).

The convention (`Ctc`) is read from the counts, PaddleOCR's: class 0 is the blank, then the
dictionary, then a space when one class is left over (`use_space_char`). Target texts of
`--eval-data` (an NPZ `target` of strings) become class sequences with the same table, so the
metric (text agreement, character error rate) compares classes.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from pipeline.artifact.manifest import Ctc, label_problem
from pipeline.artifact.records import Reading
from pipeline.artifact.tensors import TensorSpec
from pipeline.core.errors import InputError
from pipeline.export.conventions import Found
from pipeline.export.evaldata import EvalData
from pipeline.export.tasks import TEXT, fit_problem
from pipeline.runtime.ctc import characters, encode


def read_dictionary(file: Path) -> list[str]:
    """A recognizer's dictionary file: one entry per line, verbatim (see the module doc); a line holding a
    control character (a tab, a NUL) is refused, naming it."""
    if not file.is_file():
        raise InputError(f"labels file {file} not found; pass a text file with one dictionary entry per line")
    try:
        text = file.read_bytes().decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise InputError(f"labels file {file} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    lines = text.split("\n")
    if lines[-1] == "":  # the file's last line break ends a line, it starts none
        lines.pop()
    entries = [line.removesuffix("\r") for line in lines]
    for number, entry in enumerate(entries, 1):
        if problem := label_problem(entry):
            raise InputError(f"labels file {file}, line {number}: {problem}; a dictionary entry is one line of text")
    if not entries:
        raise InputError(f"labels file {file} is empty; a recognizer's dictionary has one entry per line")
    return entries


def convention(entries: int, classes: int | str) -> Ctc | None:
    """PaddleOCR's convention for a dictionary of `entries` and an output of `classes`: blank 0, then the
    dictionary, then a space when one class is left over; None when the counts fit neither."""
    if not isinstance(classes, int):
        return None
    return {1: Ctc(space=False), 2: Ctc(space=True)}.get(classes - entries)


def paddle_task(found: Found, outputs: list[TensorSpec]) -> tuple[str, str] | None:
    """(text-recognition, source) when PaddleOCR's `character` names the classes of a recognizer's output."""
    if found.dictionary is None or fit_problem(TEXT, outputs):
        return None
    if convention(len(found.dictionary), outputs[0].shape[2]) is None:
        return None
    return TEXT, f"{found.sources['dictionary']}: a dictionary for output {outputs[0].name!r}'s classes"


def paddle_dictionary(found: Found, read: dict[str, Reading], notes: list[str]) -> list[str]:
    """A recognizer's dictionary from PaddleOCR's `character`, every line kept; the note that set its lines
    aside as class names (an empty or repeated line) is dropped: as a dictionary they are fine."""
    if found.dictionary is None:
        return []
    read["labels"] = Reading(value=len(found.dictionary), source=found.sources["dictionary"])
    notes[:] = [n for n in notes if not n.startswith("metadata_props['character'] ignored")]
    return found.dictionary


def recognizer(
    dictionary: list[str], source: str, outputs: list[TensorSpec], read: dict[str, Reading], notes: list[str]
) -> Ctc:
    """The convention a recognizer's `dictionary` (from `source`) gives its output; refused when none fits."""
    first = outputs[0]
    if not dictionary:
        raise InputError(
            f"task {TEXT}: the model's dictionary is missing (no PaddleOCR metadata_props['character'] that fits); "
            "give it with --labels-file FILE, one entry per line in class order, without the blank"
        )
    found = convention(len(dictionary), first.shape[2])
    if found is None:
        raise InputError(
            f"task {TEXT}: {source} holds {len(dictionary)} entries, but output {first.name!r} has {first.shape[2]} "
            f"classes; a CTC dictionary leaves out the blank (class 0): {first.shape[2]} classes take "
            f"{first.shape[2] - 1} entries, or {first.shape[2] - 2} and a space class (PaddleOCR's use_space_char)"
        )
    space = " and a space after it" if found.space else ""
    read["ctc"] = Reading(value={"blank": found.blank, "space": found.space},
                          source=f"{len(dictionary)} entries for {first.shape[2]} classes: blank 0{space}")  # fmt: skip
    if blanks := [i for i, entry in enumerate(dictionary) if not entry.strip()]:
        shown = ", ".join(f"{i} ({dictionary[i]!r})" for i in blanks[:4])
        notes.append(f"dictionary entries {shown} are empty or white space: kept, each is a class of its own")
    return found


def target_classes(evaluation: EvalData, dictionary: list[str], ctc: Ctc, source: Path | None) -> EvalData:
    """`--eval-data`'s target texts as class sequences (pipeline/runtime/ctc.py `encode`); a target that is not
    text, or a text with a character the dictionary lacks, is refused naming it."""
    target = evaluation.target
    if target is None:
        return evaluation
    if target.dtype.kind != "U" or target.ndim != 1:
        raise InputError(
            f"--eval-data {source}: a recognizer's 'target' is one text per sample (a numpy string array [samples]), "
            f"got {target.dtype} {list(target.shape)}"
        )
    try:
        classes = encode(target.tolist(), characters(dictionary, ctc.blank, ctc.space), ctc.blank)
    except ValueError as exc:
        raise InputError(f"--eval-data {source}: target {exc}; fix the text or the dictionary") from None
    return replace(evaluation, target=classes)
