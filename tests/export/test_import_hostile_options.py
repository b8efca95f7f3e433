"""Hostile values in what `pipe import` reads beside the model: --image-preprocessing and a tokenizer.

Before: a 5,000-digit integer or nesting past the parser's depth in --image-preprocessing was exit 3;
`scale: 1e308` gave an exit-1 table of NaN; the unknown-key list left out mean, std, layout and input;
a tokenizer whose ids run past the embedding was imported (its entries were counted, not its largest
id); a model_max_length below the special tokens made every text refused later.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.artifact.tensors import TensorSpec
from pipeline.artifact.tokens import hf_limits, read_tokenizer
from pipeline.core.errors import InputError
from pipeline.runtime.images import record_image_option
from tests.text_models import save_tokenizer


def image_input() -> list[TensorSpec]:
    return [TensorSpec("x", "float32", ["batch", 3, 32, 32], "NCHW")]


@pytest.mark.parametrize(
    ("text", "refusal"),
    [
        ('{"mode": "RGB", "size": [32, 32], "scale": ' + "9" * 5000 + "}", "is not valid JSON .*Exceeds the limit"),
        ("[" * 100_000 + "]" * 100_000, "is not valid JSON .*recursion"),
        ('{"mode": "RGB", "size": [32, 32], "scale": 1e308}', r"scale 1e\+308 is not a number > 0 and <= 1e\+06"),
        ('{"mode": "RGB", "size": [32, 32], "scale": ' + "9" * 400 + "}", "scale 9999.* is not a number > 0 and <= 1e"),
        ('{"mode": "RGB", "size": [32, 32], "mean": [1e300], "std": [1]}', r"\|mean\| <= 1e\+06"),
        ('{"mode": "RGB", "size": [32, 32], "mean": [0], "std": [1e-300]}', r"1e-06 <= std"),
        (
            '{"mode": "RGB", "size": [32, 32], "sclae": 1}',
            r"unknown key\(s\) \['sclae'\]; valid keys are mode, size, resize_short, crop, letterbox, resize, scale, "
            "mean, std, layout, input",
        ),
    ],
)
def test_hostile_image_preprocessing_is_one_line(text: str, refusal: str) -> None:
    with pytest.raises(InputError, match=refusal):
        record_image_option(text, image_input())


def test_the_keys_beside_the_record_are_taken() -> None:
    inputs = image_input()
    record_image_option('{"mode": "RGB", "size": [32, 32], "mean": [0.5], "std": [0.25], "input": "x"}', inputs)
    assert inputs[0].preprocessing["mean"] == [0.5] and inputs[0].preprocessing["image"]["size"] == [32, 32]


BERT_INPUTS = ["input_ids", "attention_mask"]


def test_a_tokenizer_making_ids_past_the_embedding_is_refused_though_its_entries_fit(tmp_path: Path) -> None:
    save_tokenizer(tmp_path)
    path = tmp_path / "tokenizer.json"
    data = json.loads(path.read_text())
    data["model"]["vocab"]["zebra"] = 5000  # 121 entries, the largest id 5,000
    path.write_text(json.dumps(data))
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 128}))
    source = read_tokenizer(tmp_path)
    assert source.vocab_size == 5001 and source.tokenizer().encode("zebra").ids == [2, 5000, 3]
    with pytest.raises(InputError, match="makes 5001 ids but the model embeds 128"):
        hf_limits(tmp_path, BERT_INPUTS, source)


def test_a_model_max_length_leaving_no_room_for_text_is_refused(tmp_path: Path) -> None:
    save_tokenizer(tmp_path, max_length=2)  # [CLS] and [SEP] fill it
    with pytest.raises(InputError, match="model_max_length 2 leaves no room for text: the tokenizer adds 2 special"):
        read_tokenizer(tmp_path)
    assert read_tokenizer(save_tokenizer(tmp_path / "three", max_length=3)).max_length == 3


def _linear_with(tmp_path: Path, props: list[tuple[str, str]], raw: dict[bytes, bytes] | None = None) -> Path:
    """The conftest's linear model with these metadata_props; `raw` replaces bytes in the file as written."""
    import onnx
    from onnx import parser

    from tests.conftest import LINEAR

    model = parser.parse_model(LINEAR)
    for key, value in props:
        model.metadata_props.add(key=key, value=value)
    data = model.SerializeToString()
    for old, new in (raw or {}).items():
        data = data.replace(old, new)
    path = tmp_path / "linear.onnx"
    path.write_bytes(data)
    onnx.load(str(path))  # still a model protobuf parses
    return path


@pytest.mark.parametrize(
    ("props", "raw", "note"),
    [
        ([("names", "{0: 'AAAA'}")], {b"AAAA": b"\xff\xfe\xfd\xfc"}, "metadata_props['names'] is not UTF-8 text"),
        ([("author", "x"), ("author", "y")], None, "metadata_props['author'] appears more than once"),
    ],
)
def test_metadata_that_cannot_be_read_is_a_note_not_a_failure(
    tmp_path: Path, props: list[tuple[str, str]], raw: dict[bytes, bytes] | None, note: str
) -> None:
    """Before: a non-UTF-8 value was exit 3 (bytes where text was read), a repeated key failed the gate's
    checker (exit 1) though the docs promise a note."""
    from click.testing import CliRunner

    from pipeline.artifact.directory import Artifact
    from pipeline.cli import main
    from pipeline.export.metadata import read_metadata

    path = _linear_with(tmp_path, props, raw)
    result = CliRunner().invoke(main, ["import", str(path), "--name", "lin", "--repository", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    assert f"note: {note}" in result.output
    artifact = Artifact.load(tmp_path / "a" / "lin" / "1")
    assert any(note in n for n in artifact.manifest.stages.import_.notes)
    kept = read_metadata(artifact.path("model.onnx"))
    assert all(isinstance(v, str) for v in kept.values()) and kept.get("author", "x") == "x"


POOL = """
<ir_version: 8, opset_import: ["" : 18]>
pool (float[N, 3, H, W] x) => (float[N, 3] y)
{
    p = GlobalAveragePool(x)
    y = Flatten(p)
}
"""


def test_pictures_too_large_for_the_gates_batch_are_refused_naming_their_size(tmp_path: Path) -> None:
    """Before: `imgsz 4096` with 2 pictures made the gate allocate 4 GB for batch 16, then name --input-shape.
    Here 2 pictures at 1700x1700 (33 MiB each, 529 MiB at batch 16) stand for it."""
    import onnx
    from click.testing import CliRunner
    from onnx import parser
    from PIL import Image

    from pipeline.cli import main

    onnx.save(parser.parse_model(POOL), tmp_path / "pool.onnx")
    pictures = tmp_path / "pictures"
    pictures.mkdir()
    for i in range(2):
        Image.new("RGB", (8, 8), (40 * i, 0, 0)).save(pictures / f"{i}.png")
    record = '{"mode": "RGB", "size": [1700, 1700]}'
    result = CliRunner().invoke(main, ["import", str(tmp_path / "pool.onnx"), "--name", "pool", "--eval-data",
                                       str(pictures), "--image-preprocessing", record,
                                       "--repository", str(tmp_path / "a")])  # fmt: skip
    assert result.exit_code == 2, result.output
    said = "one sample (x [3, 1700, 1700] float32) takes 33 MiB, and the parity gate runs batches of 16"
    assert said in result.output
    assert "the picture size comes from --image-preprocessing" in result.output and "--input-shape" not in result.output
    assert not (tmp_path / "a").exists()
