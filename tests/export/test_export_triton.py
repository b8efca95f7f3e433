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
from pipeline.artifact.manifest import Manifest, TensorSpec
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
