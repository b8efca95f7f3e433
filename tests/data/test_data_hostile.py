"""Hostile data files: each refused by `pipe train` with one line (exit 2), none read whole or let through.

Before: a CSV with a 2 GB line was read whole (MemoryError, exit 3); a JSONL line nested past the
parser's depth or holding a 5,000-digit integer was exit 3; class names with a newline trained to exit 0
and then every later stage refused the manifest (exit 2).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.core.errors import InputError
from pipeline.data import load_splits
from pipeline.data.csvfile import read_csv
from pipeline.data.text import read_texts
from pipeline.recipe.schema import parse_recipe


def test_a_line_past_the_cap_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    path = tmp_path / "wide.csv"
    path.write_text("a,b,label\n1,2,x\n" + "3," * 300 + "4,y\n5,6,x\n")
    with pytest.raises(InputError, match=r"wide.csv line 3 is longer than 100 characters \(read no further\)"):
        read_csv(path, "label", max_line=100)
    small = tmp_path / "small.csv"
    small.write_text("a,b,label\n1,2,x\n3,4,y\n")
    assert read_csv(small, "label", max_line=100).x.shape == (2, 2)  # lines within the cap read as before


def test_a_2_gb_line_is_refused_at_the_default_cap(tmp_path: Path) -> None:
    """A sparse file: 2 GiB of one line cost no disk, and the reader stops after 16 Mi characters."""
    path = tmp_path / "huge.csv"
    with open(path, "wb") as f:
        f.write(b"a,b,label\n1,")
        f.truncate(2**31)
    result = CliRunner().invoke(main, ["train", str(_recipe(tmp_path, {"source": "csv", "path": "huge.csv",
                                                                       "label_column": "label"}))])  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "huge.csv line 2 is longer than 16,777,216 characters" in result.output
    assert not (tmp_path / "artifacts").exists()


def _recipe(tmp_path: Path, data: dict[str, object]) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(json.dumps({"name": "r", "model": {"arch": "mlp"}, "data": data, "train": {"epochs": 1}}))
    return path


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("[" * 100_000 + "]" * 100_000, "maximum recursion depth"),
        ('{"text": "a fine day", "label": ' + "7" * 5000 + "}", "Exceeds the limit"),
    ],
)
def test_a_jsonl_line_nested_too_deep_or_with_a_huge_integer_is_refused(tmp_path: Path, line: str, why: str) -> None:
    path = tmp_path / "texts.jsonl"
    path.write_text('{"text": "one", "label": "a"}\n' + line + "\n")
    with pytest.raises(InputError, match=rf"texts.jsonl line 2 is not JSON this reader takes \({why}"):
        read_texts(path, "text", "label")


def test_a_text_file_line_past_the_cap_is_refused(tmp_path: Path) -> None:
    for name in ("texts.jsonl", "texts.csv"):
        path = tmp_path / name
        head = "text,label\n" if name.endswith(".csv") else ""
        row = '"' + "word " * 50 + '",a\n' if name.endswith(".csv") else json.dumps({"text": "w " * 50}) + "\n"
        path.write_text(head + row)
        with pytest.raises(InputError, match=rf"{name} line {1 + bool(head)} is longer than 64 characters"):
            read_texts(path, "text", "label", max_line=64)


@pytest.mark.parametrize("labels", [["cat", "do\ng"], ["cat", "cat"]])
def test_class_names_the_manifest_refuses_are_refused_before_training(tmp_path: Path, labels: list[str]) -> None:
    x = np.random.default_rng(0).normal(size=(60, 4)).astype(np.float32)
    np.savez(tmp_path / "d.npz", X=x, y=np.arange(60) % 2, labels=np.array(labels))
    recipe = parse_recipe({"name": "r", "model": {"arch": "mlp"}, "data": {"source": "npz", "path": "d.npz"}},
                          "r.yaml", tmp_path)  # fmt: skip
    with pytest.raises(InputError, match=r"d.npz: (class name 'do\\ng' holds|class names \['cat'\] are given)"):
        load_splits(recipe)
