"""quantize on real models in real onnxruntime sessions: the right ops, smaller files, close outputs, clear refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from pipeline.core.errors import InputError
from pipeline.optimize import calibration_feed
from pipeline.optimize.cache import QuantCache
from pipeline.optimize.calibration_feed import activation_bytes
from pipeline.optimize.graph import optimize_graph, signature
from pipeline.optimize.nodes import quantizable_nodes
from pipeline.optimize.quantize import QuantSettings, weight_bytes
from pipeline.optimize.quantizers import quantize
from tests.optimize.transform_models import cnn, cosine, digits, features, mlp, relative_error, run, tokens, transformer


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("quantize")
    return {"mlp": mlp(directory), "cnn": cnn(directory), "transformer": transformer(directory)}


def inputs_of(model: Path) -> list[onnx.ValueInfoProto]:
    return list(onnx.load(str(model)).graph.input)


def test_dynamic_int8_of_a_weight_heavy_mlp(models, tmp_path: Path) -> None:
    src, dst = models["mlp"], tmp_path / "int8.onnx"
    report = quantize(src, dst, QuantSettings("dynamic"))
    assert report.quant_ops["MatMulInteger"] == 3 and report.quant_ops["DynamicQuantizeLinear"] >= 1
    assert sum(report.quantized.values()) == 3 and report.left_float == []
    assert src.stat().st_size / dst.stat().st_size > 3  # int8 weights: a quarter of the bytes, plus scales
    assert report.weight_bytes_before / report.weight_bytes_after > 3
    x = features(32, seed=5)
    assert relative_error(run(src, x), run(dst, x)) < 0.05
    assert signature(onnx.load(str(dst))) == signature(onnx.load(str(src)))
    assert report.preprocessed and report.warnings == []
    assert all(list(i.dims) in ([], [1]) for i in onnx.load(str(dst)).graph.initializer if i.name.endswith("_scale"))


def test_relative_paths_are_preprocessed_too(models, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pipe optimize works on `artifacts/...` as given: pre-processing must not lose relative paths."""
    (tmp_path / "work" / "scratch").mkdir(parents=True)
    (tmp_path / "work" / "src.onnx").write_bytes(models["mlp"].read_bytes())
    monkeypatch.chdir(tmp_path)
    report = quantize(
        Path("work/src.onnx"), Path("work/int8.onnx"), QuantSettings("dynamic"), None, Path("work/scratch")
    )
    assert report.preprocessed and report.warnings == []
    assert report.debug_bytes_removed >= 0


def test_dynamic_int8_per_channel_of_a_transformer(models, tmp_path: Path) -> None:
    src, dst = models["transformer"], tmp_path / "int8.onnx"
    report = quantize(src, dst, QuantSettings("dynamic", per_channel=True, reduce_range=True))
    assert report.quant_ops["MatMulInteger"] >= 4 and report.quant_ops["DynamicQuantizeLinear"] >= 1
    assert report.quantized.get("MatMul", 0) + report.quantized.get("Gemm", 0) >= 4
    for batch in (1, 7):
        t = tokens(batch, seed=batch)
        assert cosine(run(src, t), run(dst, t)) > 0.99
    assert report.label == "dynamic int8, per-channel, reduce-range"
    scales = [i for i in onnx.load(str(dst)).graph.initializer if i.name.endswith("_scale")]
    assert any(len(i.dims) == 1 and i.dims[0] > 1 for i in scales)  # one scale per output channel


def test_a_fused_graph_quantizes_and_the_preprocessing_fallback_is_reported(
    models, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After extended fusions (SkipLayerNormalization, FusedMatMul) symbolic shape inference gives up."""
    fused = tmp_path / "opt.onnx"
    optimize_graph(models["transformer"], fused, level="extended")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    report = quantize(fused, tmp_path / "int8.onnx", QuantSettings("dynamic"))
    assert list(cwd.iterdir()) == []  # onnxruntime's dump of the failed inference stays in the scratch directory
    assert Path.cwd() == cwd
    assert report.quant_ops["MatMulInteger"] >= 4
    assert report.preprocessed and any("symbolic shape inference failed" in w for w in report.warnings)
    t = tokens(5)
    assert cosine(run(models["transformer"], t), run(tmp_path / "int8.onnx", t)) > 0.99


@pytest.mark.parametrize("method", ["minmax", "entropy", "percentile"])
def test_static_qdq_calibrated_on_real_images(models, tmp_path: Path, method: str) -> None:
    src, dst = models["cnn"], tmp_path / "qdq.onnx"
    seen: list[tuple[int, int]] = []
    settings = QuantSettings("static", per_channel=True, calibration=method)
    report = quantize(src, dst, settings, digits(96), progress=lambda done, total: seen.append((done, total)))
    assert report.quant_ops["QuantizeLinear"] >= 3 and report.quant_ops["DequantizeLinear"] >= 6
    assert report.quantized["Conv"] == 2 and report.quantized["Gemm"] == 1
    assert seen == [(16, 96), (32, 96), (48, 96), (64, 96), (80, 96), (96, 96)]
    assert report.calibration_samples == 96
    held_out = digits(200, offset=1000)  # images the calibration never saw
    reference, quantized = run(src, held_out), run(dst, held_out)
    assert relative_error(reference, quantized) < 0.1 and cosine(reference, quantized) > 0.98
    assert src.stat().st_size / dst.stat().st_size > 2


def test_the_calibration_method_reaches_onnxruntime(models, tmp_path: Path) -> None:
    """One huge outlier among 130k values: MinMax stretches the input's range to it, Percentile does not."""
    calibration = features(2048, seed=1)
    calibration["x"][7, 3] = 1000.0
    scales = {}
    for method in ("minmax", "percentile"):
        quantize(models["mlp"], tmp_path / f"{method}.onnx", QuantSettings("static", calibration=method), calibration)
        model = onnx.load(str(tmp_path / f"{method}.onnx"))
        scales[method] = next(
            float(onnx.numpy_helper.to_array(i)) for i in model.graph.initializer if i.name == "x_scale"
        )
    assert scales["minmax"] > 50 * scales["percentile"]


@pytest.mark.parametrize("method", ["minmax", "entropy", "percentile"])
def test_a_prime_sample_count_is_calibrated_whole(models, tmp_path: Path, method: str) -> None:
    """One batch per calibration pass: the histogram calibrators never stack unequal batches, so none is left out."""
    seen: list[tuple[int, int]] = []
    report = quantize(
        models["mlp"],
        tmp_path / "qdq.onnx",
        QuantSettings("static", calibration=method),
        features(97),
        progress=lambda done, total: seen.append((done, total)),
    )
    assert report.calibration_samples == 97 and seen[-1] == (97, 97) and len(seen) == 7
    assert report.warnings == []


def test_one_calibration_per_method_and_one_preprocessing_serve_every_candidate(models, tmp_path: Path) -> None:
    """Per-channel, reduce-range, the activation type and exclusions leave the activations' ranges as they are."""
    cache = QuantCache(tmp_path / "cache")
    calibration, passes = digits(64), []
    calibration["x"][3, 0, 2, 2] = 50.0  # one outlier: MinMax stretches the input's range to it, Percentile not
    settings = [
        QuantSettings("static"),
        QuantSettings("static", per_channel=True),
        QuantSettings("static", per_channel=True, reduce_range=True),
        QuantSettings("static", calibration="percentile"),
        QuantSettings("static", per_channel=True, reduce_range=True, calibration="percentile"),
        QuantSettings("static", nodes_to_exclude=("Conv_0",)),
    ]
    scales = []
    for i, s in enumerate(settings):
        out = tmp_path / f"q{i}.onnx"
        report = quantize(models["cnn"], out, s, calibration, tmp_path / f"s{i}", lambda _d, _t, i=i: passes.append(i),
                          cache)  # fmt: skip
        assert report.preprocessed and report.calibration_samples == 64
        scales.append(activation_scales(onnx.load(str(out))))
    assert cache.computed == ["minmax", "percentile"]  # two methods, two calibrations, six models
    assert cache.preprocessings == 1  # one graph, pre-processed once
    assert sorted(set(passes)) == [0, 3]  # only the first candidate of each method read the samples
    assert scales[0] == scales[1] == scales[2] and scales[3] == scales[4] and scales[0] != scales[3]
    assert "x_scale" in scales[0] and "x_scale" not in scales[5]  # Conv_0 left in fp32: its input stays float
    common = set(scales[0]) & set(scales[5])
    assert common and all(scales[0][k] == scales[5][k] for k in common)  # the same ranges, fewer tensors


def activation_scales(model: onnx.ModelProto) -> dict[str, float]:
    """The scale of every activation a QuantizeLinear quantizes (weights are stored quantized: no QuantizeLinear)."""
    values = {t.name: t for t in model.graph.initializer}
    names = {n.input[1] for n in model.graph.node if n.op_type == "QuantizeLinear"}
    return {name: float(onnx.numpy_helper.to_array(values[name])) for name in names}


def test_static_int8_activations_on_the_transformer(models, tmp_path: Path) -> None:
    src, dst = models["transformer"], tmp_path / "qdq.onnx"
    report = quantize(src, dst, QuantSettings("static", activation_type="int8"), tokens(64, seed=3))
    assert report.quant_ops["QuantizeLinear"] > 0 and report.quantized["MatMul"] >= 3
    t = tokens(9, seed=11)
    assert cosine(run(src, t), run(dst, t)) > 0.98


def test_fp16_keeps_fp32_inputs_and_outputs_and_halves_the_weights(models, tmp_path: Path) -> None:
    src, dst = models["cnn"], tmp_path / "fp16.onnx"
    report = quantize(src, dst, QuantSettings("fp16"))
    model = onnx.load(str(dst))
    assert [v.type.tensor_type.elem_type for v in [*model.graph.input, *model.graph.output]] == [
        onnx.TensorProto.FLOAT
    ] * 2
    assert 0.45 < report.weight_bytes_after / report.weight_bytes_before < 0.55
    assert report.weight_bytes_after == weight_bytes(model) and not report.preprocessed
    images = digits(16)
    np.testing.assert_allclose(run(dst, images), run(src, images), atol=1e-2, rtol=1e-2)


def test_fp16_leaves_an_excluded_node_in_fp32_and_keeps_the_metadata(models, tmp_path: Path) -> None:
    model = onnx.load(str(models["cnn"]))
    model.metadata_props.add(key="pipe.digest", value="abc123")
    onnx.save(model, str(tmp_path / "cnn.onnx"))
    report = quantize(
        tmp_path / "cnn.onnx", tmp_path / "fp16.onnx", QuantSettings("fp16", nodes_to_exclude=("Gemm_8",))
    )
    result = onnx.load(str(tmp_path / "fp16.onnx"))
    weights = {i.name: i.data_type for i in result.graph.initializer}
    assert weights["wf"] == onnx.TensorProto.FLOAT and weights["k2"] == onnx.TensorProto.FLOAT16
    assert report.left_float == ["Gemm_8"] and "Gemm" not in report.quantized
    assert {p.key: p.value for p in result.metadata_props} == {"pipe.digest": "abc123"}


def test_an_excluded_node_stays_fp32_in_static_mode(models, tmp_path: Path) -> None:
    src = models["cnn"]
    first_conv = quantizable_nodes(src, "static", weighted=True)[0]
    assert first_conv.startswith("Conv_")  # the text model's nodes have no names: these are generated
    report = quantize(src, tmp_path / "qdq.onnx", QuantSettings("static", nodes_to_exclude=(first_conv,)), digits(32))
    model = onnx.load(str(tmp_path / "qdq.onnx"))
    conv = next(n for n in model.graph.node if n.name == first_conv)
    dequantized = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    assert not set(conv.input) & dequantized  # fp32 in, fp32 weights
    assert first_conv in report.left_float and report.excluded == [first_conv]
    assert report.quantized["Conv"] == 1 and report.label.endswith("1 node excluded")
    assert [n.name for n in onnx.load(str(src)).graph.node if n.name] == []  # the given model was not renamed


def test_an_excluded_dense_layer_stays_fp32_in_dynamic_mode(models, tmp_path: Path) -> None:
    """Pre-processing fuses MatMul+Add into Gemm and the dynamic quantizer splits it again: exclusion follows."""
    src = models["mlp"]
    last = quantizable_nodes(src, "dynamic")[-1]
    report = quantize(src, tmp_path / "int8.onnx", QuantSettings("dynamic", nodes_to_exclude=(last,)))
    assert report.quant_ops["MatMulInteger"] == 2
    assert len(report.left_float) == 1 and report.left_float[0].startswith(last)


def test_quantizable_nodes_per_mode(models) -> None:
    assert quantizable_nodes(models["mlp"], "dynamic") == ["MatMul_0", "MatMul_3", "MatMul_6"]
    static = quantizable_nodes(models["cnn"], "static")
    assert {"Conv_0", "Conv_4", "Gemm_8", "Relu_2"} <= set(static)
    assert quantizable_nodes(models["cnn"], "static", weighted=True) == ["Conv_0", "Conv_4", "Gemm_8"]
    model = onnx.load(str(models["transformer"]))
    constants = {i.name for i in model.graph.initializer}
    attention = [n.name for n in model.graph.node if n.op_type == "MatMul" and n.input[1] not in constants]
    static, dynamic = quantizable_nodes(models["transformer"]), quantizable_nodes(models["transformer"], "dynamic")
    assert len(attention) == 2 and set(attention) <= set(static)  # QDQ quantizes activation x activation too
    assert static == quantizable_nodes(models["transformer"], "static")  # the default mode
    assert not set(attention) & set(dynamic)  # dynamic: constant weights only (onnxruntime's MatMulConstBOnly)
    kinds = {n.name: n.op_type for n in model.graph.node}
    assert sorted({kinds[name] for name in dynamic}) == ["Gather", "Gemm", "MatMul"]


def test_settings_describe_and_serialize() -> None:
    settings = QuantSettings("static", per_channel=True, calibration="entropy", nodes_to_exclude=["a", "b"])
    assert settings.describe() == "static int8 (activations uint8), per-channel, entropy, 2 nodes excluded"
    assert settings.nodes_to_exclude == ("a", "b") and hash(settings)
    assert json.loads(json.dumps(settings.to_dict()))["nodes_to_exclude"] == ["a", "b"]
    assert QuantSettings("dynamic", weight_type="uint8").describe() == "dynamic uint8"
    assert QuantSettings("fp16").describe() == "fp16"


def test_refusals_name_the_value_and_the_fix(models, tmp_path: Path) -> None:
    src, dst = models["cnn"], tmp_path / "q.onnx"
    with pytest.raises(InputError, match="static quantization needs calibration samples: pass real training"):
        quantize(src, dst, QuantSettings("static"))
    with pytest.raises(InputError, match=r"inputs \['image'\] but the model's inputs are \['x'\]"):
        quantize(src, dst, QuantSettings("static"), {"image": digits(4)["x"]})
    with pytest.raises(InputError, match=r"x is float64 but the model takes float32 \(cast it"):
        quantize(src, dst, QuantSettings("static"), {"x": digits(4)["x"].astype(np.float64)})
    with pytest.raises(InputError, match=r"x has shape \[4, 8, 8, 1\] but the model takes \['\?', 1, 8, 8\]"):
        quantize(src, dst, QuantSettings("static"), {"x": digits(4)["x"].transpose(0, 2, 3, 1)})
    with pytest.raises(InputError, match=r"does not have: \['conv9'\]; its static candidates are \['Conv_0'"):
        quantize(src, dst, QuantSettings("static", nodes_to_exclude=("conv9",)), digits(4))
    with pytest.raises(InputError, match="quantization mode 'int4' is not one of dynamic, static, fp16"):
        QuantSettings("int4")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="nodes_to_exclude must be a list of node names, got 'Conv_0'"):
        QuantSettings("dynamic", nodes_to_exclude="Conv_0")  # type: ignore[arg-type]
    assert not dst.exists()


def test_a_calibration_pass_holds_no_more_activations_than_the_bound(models, tmp_path: Path, monkeypatch) -> None:
    """A calibrator keeps every intermediate tensor of its batch: a batch is as many samples as ACTIVATIONS holds
    (the PP-OCRv4 recognizer at 48x320: 192 MB a sample, 16 a pass peaked at 7.1 GiB; issue 28)."""
    src = models["cnn"]
    each = activation_bytes(onnx.load(str(src)), {"x": digits(1)["x"]}, tmp_path)
    assert each > 8 * 8 * 4  # at least the 8x8 input's own conv maps
    monkeypatch.setattr(calibration_feed, "ACTIVATIONS", 3 * each)  # three samples' worth a pass
    seen: list[tuple[int, int]] = []
    report = quantize(src, tmp_path / "qdq.onnx", QuantSettings("static"), digits(12),
                      progress=lambda done, total: seen.append((done, total)))  # fmt: skip
    assert seen[:2] == [(3, 12), (6, 12)] and seen[-1] == (12, 12)  # 3 a pass, every sample used
    assert report.calibration_samples == 12
    assert any("calibrated 3 sample(s) a pass" in w for w in report.warnings), report.warnings
