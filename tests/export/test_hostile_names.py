"""Names and labels that would escape into labels.txt, config.pbtxt or a shell line (issue 23)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import pytest
from click.testing import CliRunner

from pipeline.cli import main
from tests.export.test_export_import import linear_model


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "linear.onnx"
    onnx.save(linear_model(), path)
    return path


@pytest.mark.parametrize(
    ("labels", "shown"),
    [
        ("a\nb,c,d", "'\\n'"),  # labels.txt would hold 4 lines for 3 classes
        ("a\tb,c,d", "'\\t'"),
        ("a\x00,c,d", "'\\x00'"),
        ("a\u200b,c,d", "'\\u200b'"),  # zero-width space: looks like "a"
    ],
)
def test_a_label_holding_a_control_character_is_refused(tmp_path: Path, source: Path, labels: str, shown: str) -> None:
    repo = tmp_path / "repo"
    result = invoke("import", str(source), "--name", "l", "--labels", labels, "--repository", str(repo))
    assert result.exit_code == 2, result.output
    assert "one line of printable text" in result.output and shown in result.output, result.output
    assert not repo.exists()


def test_a_labels_file_with_a_byte_order_mark_is_cleaned_and_triton_gets_one_line_a_class(
    tmp_path: Path, source: Path
) -> None:
    (tmp_path / "labels.txt").write_bytes("\ufeffcat\r\ndog\r\nbird\r\n".encode())
    repo = tmp_path / "repo"
    result = invoke("import", str(source), "--name", "l", "--labels-file", str(tmp_path / "labels.txt"),
                    "--repository", str(repo))  # fmt: skip
    assert result.exit_code == 0, result.output
    exported = invoke("export", str(repo / "l" / "1"), "--target", "triton", "--out", str(tmp_path / "triton"))
    assert exported.exit_code == 0, exported.output
    assert (tmp_path / "triton" / "l" / "labels.txt").read_text().splitlines() == ["cat", "dog", "bird"]


def test_a_hand_edited_manifest_with_a_newline_in_a_label_is_refused(tmp_path: Path, source: Path) -> None:
    repo = tmp_path / "repo"
    assert invoke("import", str(source), "--name", "l", "--labels", "a,b,c", "--repository", str(repo)).exit_code == 0
    manifest = repo / "l" / "1" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"b"', '"b\\nx"'))
    result = invoke("info", str(repo / "l" / "1"))
    assert result.exit_code == 2 and "one line of printable text" in result.output, result.output


def test_an_empty_file_or_a_tensor_proto_is_not_an_onnx_model(tmp_path: Path) -> None:
    (tmp_path / "empty.onnx").write_bytes(b"")
    tensor = onnx.numpy_helper.from_array(np.zeros((4, 3), np.float32))  # unnamed: it parses as a ModelProto
    (tmp_path / "tensor.onnx").write_bytes(tensor.SerializeToString())
    for file, why in (("empty.onnx", "is empty"), ("tensor.onnx", "holds no graph")):
        result = invoke("import", str(tmp_path / file), "--name", "t", "--repository", str(tmp_path / "repo"))
        assert result.exit_code == 2 and why in result.output and "not an ONNX model" in result.output, result.output
        assert "0 graph inputs" not in result.output
