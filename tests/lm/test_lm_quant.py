"""Weight-only int8/int4 of a decoder judged on text, its tokens/s, and `pipe check` of a decoder.

Every figure is taken on a Llama trained from scratch by `pipe train` (tests/lm/trained_lm.py, cached
by its code's digest): random weights' top logits are near ties, so any rounding would flip them.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result

from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import load_golden
from pipeline.cli.group import main
from pipeline.core.errors import InputError
from pipeline.optimize.weight_only import WeightSettings, quantize_weights
from pipeline.runtime.lm_speed import measure_lm, ort_decoders
from pipeline.runtime.runners import ort_runner
from pipeline.verify.choose import GateSettings, hop_policy
from pipeline.verify.lm_judge import TokenAgreement, held_out_blocks, teacher_forced, text_figures
from tests.lm.trained_lm import trained_copy, trained_version


def pipe(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


@pytest.fixture(scope="module")
def optimized(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Result]:
    """A copy of the trained Llama through `pipe optimize` with the defaults: opt and both weight-only kinds."""
    root = trained_copy(tmp_path_factory.mktemp("optimized"))
    return root, pipe("optimize", str(root))


def test_the_test_model_is_trained_far_below_uniform() -> None:
    m = Artifact.load(trained_version()).manifest
    assert m.task == "text-generation" and m.metrics["perplexity"] < 150  # vocabulary 1024: uniform is 1024


def test_a_decoder_gets_weight_only_int8_and_int4_judged_on_text(optimized: tuple[Path, Result]) -> None:
    root, result = optimized
    assert result.exit_code == 0, result.output
    assert "int8-dynamic, int8-static not made: a decoder's variants are weight-only" in result.output
    m = Artifact.load(root).manifest
    assert {"opt", "int8-weights", "int4-weights"} <= set(m.variants)
    fp32, int8, int4 = (m.files[f].size for f in ("model.onnx", m.variants["int8-weights"].file,
                                                   m.variants["int4-weights"].file))  # fmt: skip
    assert int4 < int8 < 0.6 * fp32  # the embedding (a fifth of this small model) stays fp32 by default
    assert m.variants["int8-weights"].passed and m.variants["int8-weights"].precision == "int8"
    assert m.variants["int4-weights"].precision == "int4"
    assert m.variants["int8-weights"].settings == {"bits": 8, "block_size": 32, "symmetric": True,
                                                   "accuracy_level": 4, "embeddings": False}  # fmt: skip
    report = json.loads((root / "reports" / "optimize.json").read_text())
    assert report["policy"] == {"policy": "token agreement", "min_agreement": 0.9, "max_kl": 0.05}
    rows = {v["variant"]: v for v in report["variants"]}
    assert rows["int8-weights"]["budget_figure"] > 0.97  # next-token agreement with fp32, teacher-forced
    assert rows["opt"]["budget_figure"] < 1e-3  # graph passes only: the logits themselves, element by element
    metric = rows["int4-weights"]["gate"]["metric"]
    assert metric["name"] == "perplexity" and abs(metric["onnx"] / metric["reference"] - 1) < 0.02
    assert rows["int4-weights"]["details"]["kept"] == []  # every MatMul, lm_head included, in 4 bits
    speed = rows["int8-weights"]["latency"]
    assert speed["decode_tokens_per_s"] > 0 and speed["prefill_tokens_per_s"] > 0 and speed["runs"] >= 3
    markdown = (root / "reports" / "optimize.md").read_text()
    assert "| model | time to first token (ms) | prefill tokens/s | x fp32 | decode tokens/s | x fp32 |" in markdown
    said = r"[\d,]+ tokens/s, [\d.]+x fp32's [\d,]+: (faster than|SLOWER than|on par with) fp32[^;]*"
    assert re.fullmatch(f"prefill {said}; decode {said}", rows["int4-weights"]["note"])  # faster or SLOWER, said


def test_a_budget_int4_misses_fails_it_and_auto_keeps_the_smallest_within(
    optimized: tuple[Path, Result], tmp_path: Path
) -> None:
    root = tmp_path / "tiny-python-llama" / "1"
    shutil.copytree(optimized[0], root)
    result = pipe("optimize", str(root), "--quantize", "int4-weights", "--graph", "none", "--min-token-agreement",
                  "0.999", "--strict")  # fmt: skip
    assert result.exit_code == 1, result.output
    int4 = Artifact.load(root).manifest.variants["int4-weights"]
    assert not int4.passed and "budget >= 0.999" in int4.reason
    result = pipe("optimize", str(root), "--quantize", "auto", "--graph", "none", "--min-token-agreement", "0.97")
    assert result.exit_code == 0, result.output
    assert "auto keeps int8-weights: the smallest within budget" in result.output and "dropped int4-weights" in (
        result.output
    )
    assert {"int8-weights"} == set(Artifact.load(root).manifest.variants) - {"fp32"}


def test_text_budgets_belong_to_decoders_and_decoders_to_them() -> None:
    policy = hop_policy("optimize", "int4", "text-generation", False, GateSettings(min_token_agreement=0.8))
    assert policy == TokenAgreement(0.8, 0.05)
    with pytest.raises(InputError, match="max_kl 0.1: the budget of decoders"):
        hop_policy("optimize", "int8", "classification", True, GateSettings(max_kl=0.1))
    with pytest.raises(InputError, match="a text-generation model has no task metric"):
        hop_policy("optimize", "int8", "text-generation", False, GateSettings(max_accuracy_drop=0.01))
    with pytest.raises(InputError, match="min_token_agreement 1.5"):
        TokenAgreement(1.5, 0.05)


def test_teacher_forced_figures_of_a_model_against_itself_and_its_int4(optimized: tuple[Path, Result]) -> None:
    root = optimized[0]
    artifact = Artifact.load(root)
    cache = artifact.manifest.generation.cache
    ids, mask = held_out_blocks(load_golden(artifact).inputs)
    want = teacher_forced(ort_runner(root / "model.onnx"), cache, ids, mask)
    same = text_figures(want, want, ids, mask)
    assert same.agreement == 1.0 and abs(same.kl) < 1e-9 and same.perplexity == same.reference_perplexity
    assert same.tokens == int((mask[:, :-1] & mask[:, 1:]).sum())  # every position that has a next token
    assert same.perplexity < 150
    got = teacher_forced(ort_runner(root / "variants" / "model.int4-weights.onnx"), cache, ids, mask)
    int4 = text_figures(got, want, ids, mask)
    assert 0.8 < int4.agreement < 1.0 and 0 < int4.kl < 0.05


def test_lm_speed_times_prefill_and_decode_side_by_side(optimized: tuple[Path, Result]) -> None:
    root = optimized[0]
    artifact = Artifact.load(root)
    golden = load_golden(artifact).inputs
    ids, mask = golden["input_ids"][:2], golden["attention_mask"][:2]
    files = {"fp32": root / "model.onnx", "int8": root / "variants" / "model.int8-weights.onnx"}
    cache = artifact.manifest.generation.cache
    speeds = measure_lm(ort_decoders(files), cache, ids, mask, new_tokens=4, seconds=0.1, min_runs=2)
    for speed in speeds.values():
        assert speed.batch == 2 and speed.prompt_tokens == ids.shape[1] and speed.new_tokens == 4
        assert speed.runs >= 2 and speed.prefill_ms > speed.decode_ms > 0  # 64 tokens a row against 1
        assert speed.prefill_tokens_per_s == pytest.approx(2 * ids.shape[1] / (speed.prefill_ms / 1e3))
    with pytest.raises(InputError, match="new_tokens is 0.*min_runs 0"):
        measure_lm(ort_decoders(files), cache, ids, mask, new_tokens=0, min_runs=0)


def test_serve_generates_with_a_weight_only_variant_each_stream_as_alone(optimized: tuple[Path, Result]) -> None:
    """`pipe serve --variant int4-weights`'s engine on the trained Llama: the MatMulNBits graph decodes four
    prompts in shared steps, each answer equal to its own served alone, and equal to the variant's own
    greedy generation (pipeline/runtime/generate.py)."""
    import asyncio

    import onnx

    from pipeline.runtime.generate import greedy
    from pipeline.runtime.session import create_session
    from pipeline.serve.generation.sampler import Sampling
    from pipeline.serve.generation.sequence import Job
    from pipeline.serve.generation.served import TextGenerator
    from pipeline.serve.generation.settings import GenerationSettings
    from pipeline.serve.variant_choice import choose_quietly

    root = optimized[0]
    artifact = Artifact.load(root)
    choice, _ = choose_quietly(artifact, {"*": "int4-weights"})
    path = root / choice.file
    assert "MatMulNBits" in {n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node}
    gen = TextGenerator.of(
        root, artifact.manifest, create_session(path, "cpu", 1, 1, False), GenerationSettings(), None
    )
    assert gen is not None
    prompts = [gen.encode(text, True) for text in ("def add(a, b):", "for i in range(", "import os", "x = [")]

    async def answers(batch: list[list[int]]) -> list[list[int]]:
        seqs = [gen.engine.submit(Job(ids, 8, Sampling(temperature=0))) for ids in batch]
        out = []
        for seq in seqs:
            while (await seq.events.get()).finish is None:
                pass
            out.append(seq.tokens[len(seq.job.prompt) :])
        return out

    alone = [asyncio.run(answers([ids]))[0] for ids in prompts]
    assert asyncio.run(answers(prompts)) == alone
    eos = artifact.manifest.generation.eos_token_ids
    runner = ort_runner(path)
    for ids, tokens in zip(prompts, alone, strict=True):
        generation = artifact.manifest.generation
        made = greedy(runner, generation.cache, np.array([ids]), np.ones((1, len(ids)), dtype=np.int64), 8, eos,
                      generation.padding_id)  # fmt: skip
        assert tokens == [int(t) for t in made.tokens[0][: len(tokens)]]


def test_a_tied_lm_head_is_untied_and_quantized(tmp_path: Path) -> None:
    """An lm_head that reads the embedding through a Transpose (tied) is given its own weight and quantized."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    table = np.random.default_rng(0).normal(size=(96, 64)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["embed", "ids"], ["hidden"]),
        helper.make_node("Transpose", ["embed"], ["embed_t"], perm=[1, 0]),
        helper.make_node("MatMul", ["hidden", "embed_t"], ["logits"], name="lm_head"),
    ]
    graph = helper.make_graph(
        nodes,
        "tied",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", 96])],
        [numpy_helper.from_array(table, "embed")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), tmp_path / "tied.onnx")
    report = quantize_weights(tmp_path / "tied.onnx", tmp_path / "int4.onnx", WeightSettings(4, 32, True, 4, False))
    assert report.untied == ["lm_head"] and report.quantized == 1 and report.kept == []
    ops = [n.op_type for n in onnx.load(tmp_path / "int4.onnx").graph.node]
    assert ops == ["Gather", "MatMulNBits"]  # the Transpose nothing reads is gone
    ids = {"ids": np.arange(96, dtype=np.int64).reshape(2, 48)}
    want = ort_runner(tmp_path / "tied.onnx")(ids)["logits"]
    got = ort_runner(tmp_path / "int4.onnx")(ids)["logits"]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 0.2 and not np.array_equal(got, want)


def test_check_of_a_decoder_compares_its_text_with_the_baseline(optimized: tuple[Path, Result], tmp_path: Path) -> None:
    baseline = trained_version()
    same = pipe("check", str(trained_copy(tmp_path / "same")), "--baseline", str(baseline), "--latency-seconds", "0.2")
    assert same.exit_code == 0, same.output
    assert re.search(r"greedy agreement +passed +1\.0000 of 128 greedy tokens", same.output)
    assert re.search(r"\n +perplexity +passed +perplexity [\d.]+ -> [\d.]+ on \d+ held-out next tokens", same.output)
    # a candidate whose model.onnx is the int4 variant: another model, recorded as an artifact records it
    candidate = trained_copy(tmp_path / "int4")
    shutil.copyfile(optimized[0] / "variants" / "model.int4-weights.onnx", candidate / "model.onnx")
    artifact = Artifact.load(candidate, verify=False)
    artifact.add_file("model.onnx")
    artifact.save()
    changed = pipe("check", str(candidate), "--baseline", str(baseline), "--latency-seconds", "0.2",
                   "--max-perplexity-increase", "0.0001", "--min-greedy-agreement", "1")  # fmt: skip
    assert changed.exit_code == 1, changed.output
    assert "perplexity: perplexity" in changed.output and "breaks max_perplexity_increase 0.01%" in changed.output
    assert "greedy agreement:" in changed.output and "breaks min_greedy_agreement 1" in changed.output


def test_a_gemm_block_is_quantized_as_a_matmul(tmp_path: Path) -> None:
    """GPT-2's blocks export as Gemm (with a bias, sometimes a transposed weight): rewritten as MatMul + Add."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight, bias = rng.normal(size=(48, 64)).astype(np.float32), rng.normal(size=48).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="c_fc", transB=1)],
        "gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", 48])],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), tmp_path / "gemm.onnx")
    report = quantize_weights(tmp_path / "gemm.onnx", tmp_path / "int8.onnx", WeightSettings(8, 32, True, 4, False))
    assert report.gemms == ["c_fc"] and report.quantized == 1
    assert [n.op_type for n in onnx.load(tmp_path / "int8.onnx").graph.node] == ["MatMulNBits", "Add"]
    x = {"x": rng.normal(size=(5, 64)).astype(np.float32)}
    want, got = (ort_runner(tmp_path / name)(x)["y"] for name in ("gemm.onnx", "int8.onnx"))
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 0.02
