"""`pipe export --target triton`: a model repository whose config.pbtxt parses as Triton's ModelConfig."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import onnx
import onnx.parser
from click.testing import CliRunner
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from pipeline.artifact.directory import Artifact
from pipeline.artifact.manifest import Manifest
from pipeline.artifact.tensors import TensorSpec
from pipeline.cli import main
from pipeline.export.importer import import_onnx


def write(tmp_path: Path, batch: str, name: str) -> Path:
    """A two-input model (features + int64 ids over a symbolic sequence) in ONNX's text syntax."""
    model = onnx.parser.parse_model(f"""
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[{batch}, 4] features, int64[{batch}, seq] ids) => (float[{batch}, 4] logits, int64[{batch}] count)
    {{
        one = Constant<value = int64[1] {{1}}>()
        f = Cast<to = 1>(ids)
        s = ReduceSum<keepdims = 1>(f, one)
        logits = Add(features, s)
        count = ReduceSum<keepdims = 0>(ids, one)
    }}""")
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return path


def parse(model_dir: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse((model_dir / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())


def test_batched_model_gives_dynamic_batching_config_that_parses(tmp_path: Path) -> None:
    artifact = import_onnx(write(tmp_path, "batch", "m"), "twoin", tmp_path / "artifacts", labels=list("abcd"))
    out = tmp_path / "triton"
    result = CliRunner().invoke(main, ["export", str(artifact.root.parent), "--target", "triton", "--out", str(out)])
    assert result.exit_code == 0, result.output

    config = parse(out / "twoin")
    assert config.name == "twoin" and config.platform == "onnxruntime_onnx"
    assert config.max_batch_size == 64 and config.HasField("dynamic_batching")
    inputs = {t.name: (model_config_pb2.DataType.Name(t.data_type), list(t.dims)) for t in config.input}
    outputs = {t.name: (model_config_pb2.DataType.Name(t.data_type), list(t.dims)) for t in config.output}
    assert inputs == {"features": ("TYPE_FP32", [4]), "ids": ("TYPE_INT64", [-1])}  # batch axis implied
    assert outputs == {"logits": ("TYPE_FP32", [4]), "count": ("TYPE_INT64", [])}
    assert config.output[0].label_filename == "labels.txt"
    assert (out / "twoin" / "labels.txt").read_text().split() == list("abcd")
    assert config.parameters["pipe.identity_digest"].string_value == artifact.manifest.identity_digest()
    copied = out / "twoin" / "1" / "model.onnx"
    assert copied.read_bytes() == artifact.path("model.onnx").read_bytes()
    assert not [p.name for p in (out / "twoin").iterdir() if p.name.startswith(".")]  # no staging left

    # A new version without labels replaces the config; the old labels.txt must not linger beside it.
    unlabeled = import_onnx(write(tmp_path, "batch", "m2"), "twoin", tmp_path / "artifacts")
    again = CliRunner().invoke(main, ["export", str(unlabeled.root), "--target", "triton", "--out", str(out)])
    assert again.exit_code == 0, again.output
    assert not parse(out / "twoin").output[0].label_filename
    assert not (out / "twoin" / "labels.txt").exists()
    assert sorted(p.name for p in (out / "twoin").iterdir()) == ["1", "2", "config.pbtxt"]


def test_fixed_batch_model_gets_no_batching_and_full_dims(tmp_path: Path) -> None:
    artifact = import_onnx(write(tmp_path, "2", "fixed"), "fixed", tmp_path / "artifacts", task="regression")
    result = CliRunner().invoke(
        main, ["export", str(artifact.root), "--target", "triton", "--out", str(tmp_path / "t")]
    )
    assert result.exit_code == 0, result.output
    config = parse(tmp_path / "t" / "fixed")
    assert config.max_batch_size == 0 and not config.HasField("dynamic_batching")
    assert [list(t.dims) for t in config.input] == [[2, 4], [2, -1]]
    assert not config.output[0].label_filename


def test_triton_target_needs_out_and_an_exported_model(tmp_path: Path) -> None:
    root = tmp_path / "artifacts" / "bare" / "1"
    specs = [TensorSpec("x", "float32", ["batch", 4])]
    Artifact(root, Manifest("bare", 1, "classification", specs, specs)).save()
    runner = CliRunner()
    no_out = runner.invoke(main, ["export", str(root), "--target", "triton"])
    assert no_out.exit_code == 2 and "pass --out DIR" in no_out.output
    no_model = runner.invoke(main, ["export", str(root), "--target", "triton", "--out", str(tmp_path / "t")])
    assert no_model.exit_code == 2 and "has no model.onnx yet; run `pipe export" in no_model.output
    assert not (tmp_path / "t").exists()  # refused before anything was written


def test_instance_kind_is_omitted_unless_asked_and_files_are_readable_by_others(tmp_path: Path) -> None:
    artifact = import_onnx(write(tmp_path, "batch", "m"), "kinds", tmp_path / "artifacts")
    out = tmp_path / "triton"
    previous = os.umask(0o022)  # the usual umask: new directories 0755, new files 0644
    try:
        result = CliRunner().invoke(main, ["export", str(artifact.root), "--target", "triton", "--out", str(out)])
        assert result.exit_code == 0, result.output
        assert not parse(out / "kinds").instance_group  # Triton decides: its GPUs when it has them, else CPU
        version = out / "kinds" / "1"
        assert stat.S_IMODE(version.stat().st_mode) == 0o755  # not mkdtemp's owner-only 0700
        for path in (version / "model.onnx", out / "kinds" / "config.pbtxt"):
            assert stat.S_IMODE(path.stat().st_mode) == 0o644, path

        for kind, expected in (("gpu", "KIND_GPU"), ("cpu", "KIND_CPU")):
            args = ["export", str(artifact.root), "--target", "triton", "--out", str(out), "--instance-kind", kind]
            result = CliRunner().invoke(main, args)
            assert result.exit_code == 0, result.output
            groups = parse(out / "kinds").instance_group
            assert [(g.count, model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind)) for g in groups] == [(1, expected)]
    finally:
        os.umask(previous)
    bad = CliRunner().invoke(main, ["export", str(artifact.root), "--target", "triton", "--out", str(out),
                                    "--instance-kind", "tpu"])  # fmt: skip
    assert bad.exit_code == 2 and "'tpu' is not one of" in bad.output


def renamed(tmp_path: Path, name: str) -> Path:
    """The one-input linear model with its input called `name` (any bytes ONNX allows)."""
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, 4] x) => (float[batch, 4] y) { y = Relu(x) }""")
    model.graph.input[0].name = name
    model.graph.node[0].input[0] = name
    path = tmp_path / "renamed.onnx"
    onnx.save(model, path)
    return path


def test_an_out_that_overlaps_the_artifact_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    artifact = import_onnx(write(tmp_path, "batch", "m"), "twoin", tmp_path / "repo", labels=list("abcd"))
    Artifact.load(artifact.root)  # its lock file exists from here on, as after any verified load

    def listing() -> list[Path]:
        return sorted(p.relative_to(tmp_path) for p in (tmp_path / "repo").rglob("*"))

    before = listing()
    for out in (tmp_path / "repo", artifact.root, artifact.root / "variants", artifact.root.parent):
        result = CliRunner().invoke(main, ["export", str(artifact.root), "--target", "triton", "--out", str(out)])
        assert result.exit_code == 2, (out, result.output)
        assert "overlaps the artifact" in result.output, result.output
    assert listing() == before
    Artifact.load(artifact.root)  # still whole: manifest, golden, model.onnx verify


def test_an_out_that_is_a_file_is_refused(tmp_path: Path) -> None:
    artifact = import_onnx(write(tmp_path, "batch", "m"), "twoin", tmp_path / "repo")
    (tmp_path / "file").write_text("keep me")
    result = CliRunner().invoke(
        main, ["export", str(artifact.root), "--target", "triton", "--out", str(tmp_path / "file")]
    )
    assert result.exit_code == 2 and "is a file, not a directory" in result.output, result.output
    assert (tmp_path / "file").read_text() == "keep me"


def test_a_version_directory_holding_foreign_files_is_not_deleted(tmp_path: Path) -> None:
    artifact = import_onnx(write(tmp_path, "batch", "m"), "twoin", tmp_path / "repo")
    mine = tmp_path / "triton" / "twoin" / "1"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("not pipe's")
    result = CliRunner().invoke(
        main, ["export", str(artifact.root), "--target", "triton", "--out", str(tmp_path / "triton")]
    )
    assert result.exit_code == 2 and "notes.txt" in result.output, result.output
    assert (mine / "notes.txt").read_text() == "not pipe's"
    (mine / "notes.txt").unlink()  # an earlier export of pipe's own is replaced
    for _ in range(2):
        result = CliRunner().invoke(
            main, ["export", str(artifact.root), "--target", "triton", "--out", str(tmp_path / "triton")]
        )
        assert result.exit_code == 0, result.output


def test_tensor_names_cannot_inject_into_config_pbtxt(tmp_path: Path) -> None:
    for name in ('x" data_type: TYPE_STRING name: "z', 'x\\" } input [ {', "x\\", "é ü"):
        root = tmp_path / str(abs(hash(name)))
        artifact = import_onnx(renamed(root.parent, name), "named", root)
        result = CliRunner().invoke(
            main, ["export", str(artifact.root), "--target", "triton", "--out", str(root / "t")]
        )
        assert result.exit_code == 0, result.output
        config = parse(root / "t" / "named")
        assert [t.name for t in config.input] == [name]  # one input, its name intact
        assert config.input[0].data_type == model_config_pb2.DataType.Value("TYPE_FP32")
