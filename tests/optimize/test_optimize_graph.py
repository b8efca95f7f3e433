"""optimize_graph on real models in real onnxruntime sessions: same outputs, no more nodes, batch still free."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
import onnxslim
import pytest

from pipeline.core.errors import ArtifactError, InputError
from pipeline.optimize import graph
from pipeline.optimize.graph import node_count, op_counts, optimize_graph, signature, signature_changes
from tests.optimize.transform_models import HEADER, cnn, digits, run, tokens, transformer


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, object]]:
    """Each model with a function giving `count` real inputs for it."""
    directory = tmp_path_factory.mktemp("graph")
    return {"cnn": (cnn(directory), digits), "transformer": (transformer(directory), tokens)}


@pytest.mark.parametrize("level", ["basic", "extended"])
@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_outputs_kept_nodes_not_added_batch_still_symbolic(models, tmp_path: Path, name: str, level: str) -> None:
    src, data = models[name]
    dst = tmp_path / "opt.onnx"
    report = optimize_graph(src, dst, level=level)
    for batch in (1, 7):  # a batch frozen at export size or at 1 fails one of these
        inputs = data(batch)
        np.testing.assert_allclose(run(dst, inputs), run(src, inputs), atol=1e-4, rtol=1e-4)
    assert report.nodes_after == node_count(dst) <= report.nodes_before == node_count(src)
    assert signature(onnx.load(str(dst))) == signature(onnx.load(str(src)))
    assert onnx.load(str(dst)).graph.input[0].type.tensor_type.shape.dim[0].dim_param  # still a name, not a size


def test_extended_fuses_what_basic_folds_and_the_report_says_so(models, tmp_path: Path) -> None:
    src, _ = models["cnn"]
    basic = optimize_graph(src, tmp_path / "basic.onnx", level="basic")
    extended = optimize_graph(src, tmp_path / "extended.onnx", level="extended")
    # BatchNormalization folds into the Conv before it at both levels; Conv+Relu fuse only at extended
    assert "BatchNormalization" not in basic.ops_after and basic.ops_before["BatchNormalization"] == 1
    assert extended.ops_after.get("com.microsoft.FusedConv", 0) >= 1
    assert extended.nodes_after < basic.nodes_after < basic.nodes_before
    assert not any("NCHWc" in op for op in extended.ops_after)  # never a hardware-specific layout
    assert [(s.name, s.version, s.kept) for s in extended.steps] == [
        ("onnxruntime", ort.__version__, True),
        ("onnxslim", onnxslim.__version__, True),
    ]
    first = basic.steps[0]
    assert first.nodes_before - first.nodes_after == sum(first.removed.values()) - sum(first.added.values())
    assert basic.ops_before == op_counts(src)
    json.dumps(extended.to_dict())  # the stage writes it into reports/optimize.json


def test_slim_off_runs_onnxruntime_alone(models, tmp_path: Path) -> None:
    report = optimize_graph(models["transformer"][0], tmp_path / "opt.onnx", slim=False)
    assert [s.name for s in report.steps] == ["onnxruntime"]


def test_a_failing_onnxslim_keeps_the_onnxruntime_result_and_says_so(models, tmp_path, monkeypatch) -> None:
    def broken(model: onnx.ModelProto) -> onnx.ModelProto:
        raise RuntimeError("pattern match exploded")

    monkeypatch.setattr(graph.onnxslim, "slim", broken)  # a fault injected into onnxslim alone
    src, data = models["cnn"]
    dst = tmp_path / "opt.onnx"
    report = optimize_graph(src, dst)
    slim = report.steps[-1]
    assert not slim.kept and "pattern match exploded" in slim.note
    assert report.warnings and "onnxruntime result is kept" in report.warnings[0]
    assert report.nodes_after == report.steps[0].nodes_after == node_count(dst)
    np.testing.assert_allclose(run(dst, data(3)), run(src, data(3)), atol=1e-4, rtol=1e-4)


def frozen(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with its batch dim fixed at 1, as a careless pass might leave it."""
    for value in [*model.graph.input, *model.graph.output]:
        value.type.tensor_type.shape.dim[0].dim_value = 1
    return model


def test_a_step_that_freezes_the_batch_is_refused(models, tmp_path, monkeypatch) -> None:
    src, _ = models["cnn"]
    monkeypatch.setattr(graph.onnxslim, "slim", frozen)  # faults injected into one step at a time
    report = optimize_graph(src, tmp_path / "opt.onnx")
    assert not report.steps[-1].kept and "x: shape ['N', 1, 8, 8] became [1, 1, 8, 8]" in report.steps[-1].note
    assert signature(onnx.load(str(tmp_path / "opt.onnx"))) == signature(onnx.load(str(src)))

    real = graph.run_onnxruntime

    def freezing(src: Path, dst: Path, level: str, external: bool = False) -> None:
        real(src, dst, level, external)
        onnx.save(frozen(onnx.load(str(dst))), str(dst))

    monkeypatch.setattr(graph, "run_onnxruntime", freezing)
    with pytest.raises(ArtifactError, match=r"broke the model \(at extended: it changed .*; at basic: it changed"):
        optimize_graph(src, tmp_path / "opt2.onnx")  # refused at extended, then at basic: nothing lower to try
    assert not (tmp_path / "opt2.onnx").exists()
    with pytest.raises(ArtifactError, match=r"broke the model \(at basic: it changed the signature") as refused:
        optimize_graph(src, tmp_path / "opt3.onnx", level="basic")
    assert "at extended" not in str(refused.value) and "--graph none" in str(refused.value)  # never a higher level


def test_a_frozen_batch_or_renamed_output_is_a_signature_change() -> None:
    def model(batch: str, output: str, out_batch: str | None = None, width: str = "4") -> onnx.ModelProto:
        out = out_batch or batch
        return onnx.parser.parse_model(
            f"{HEADER}\ng (float[{batch}, 4] x) => (float[{out}, {width}] {output}) {{ {output} = Relu(x) }}"
        )

    assert signature_changes(model("N", "y"), model("N", "y")) == []
    assert signature_changes(model("N", "y"), model("1", "y")) == ["x: shape ['N', 4] became [1, 4]"]
    assert signature_changes(model("N", "y"), model("N", "z")) == ["outputs ['y'] became ['z']"]
    assert signature_changes(model("N", "y"), model("N", "y", width="5")) == ["y: shape ['N', 4] became ['N', 5]"]
    # a free output dim that shape inference wrote as its size or an expression: run, not refused (issue 28)
    assert signature_changes(model("N", "y", width="d"), model("N", "y", width="4")) == []
    assert signature_changes(model("N", "y", out_batch="n_out"), model("N", "y", out_batch="M")) == []
    expression = model("N", "y")
    expression.graph.output[0].type.tensor_type.shape.dim[1].dim_param = "floor((8210*floor(w/2)))"  # a fixed 4
    assert signature_changes(model("N", "y"), expression) == []


def test_an_input_with_a_default_stays_one(tmp_path: Path) -> None:
    """A written decoder's `logits_from` is an initializer listed as a graph input, which a runtime may override;
    onnxslim folds it into a constant, so its result is refused and onnxruntime's (which keeps it) is the variant."""
    text = f"""{HEADER}
    g (float[N, S, 4] x, int64[1] start) => (float[N, M, 4] y)
    <int64[1] start = {{0}}, int64[1] end = {{1000}}, int64[1] axis = {{1}}> {{ y = Slice(x, start, end, axis) }}"""
    model = onnx.parser.parse_model(text)
    folded = onnx.parser.parse_model(text)
    folded.graph.input.pop()  # the default kept as a plain initializer: no longer settable
    assert signature_changes(model, folded) == ["inputs with a default ['start'] became constants"]
    src = tmp_path / "slice.onnx"
    onnx.save(model, str(src))
    optimize_graph(src, tmp_path / "opt.onnx")
    optimized = onnx.load(str(tmp_path / "opt.onnx"))
    assert "start" in {v.name for v in optimized.graph.input} & {t.name for t in optimized.graph.initializer}


def test_metadata_props_survive(tmp_path: Path) -> None:
    src = cnn(tmp_path)
    model = onnx.load(str(src))
    model.metadata_props.add(key="pipe.digest", value="abc123")
    onnx.save(model, str(src))
    optimize_graph(src, tmp_path / "opt.onnx")
    assert {p.key: p.value for p in onnx.load(str(tmp_path / "opt.onnx")).metadata_props}["pipe.digest"] == "abc123"


def test_refusals_name_the_value_and_the_fix(models, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="'all' is not one of basic, extended"):
        optimize_graph(models["cnn"][0], tmp_path / "opt.onnx", level="all")  # type: ignore[arg-type]
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    with pytest.raises(ArtifactError, match="junk.onnx: not a readable ONNX model"):
        optimize_graph(tmp_path / "junk.onnx", tmp_path / "opt.onnx")
    assert not (tmp_path / "opt.onnx").exists()
