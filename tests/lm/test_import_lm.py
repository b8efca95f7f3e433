"""`pipe import DIR` of a causal LM: task text-generation with no flags, one graph with its KV cache,
greedy tokens equal to transformers' generate, the generation record and the chat template in the identity."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from pipeline.artifact.directory import Artifact
from pipeline.artifact.manifest import Manifest
from pipeline.cli.group import main
from pipeline.core.errors import ArtifactError
from pipeline.runtime.generate import greedy
from pipeline.runtime.runners import ort_runner
from pipeline.runtime.text import TextEncoder
from tests.lm.lm_models import save_gpt2, save_llama


def pipe(*args: str) -> object:
    return CliRunner().invoke(main, list(args))


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Artifact]:
    """A tiny random Llama imported once with no flags: its directory and the artifact."""
    base = tmp_path_factory.mktemp("llama")
    source = save_llama(base / "llama")
    result = pipe("import", str(source), "--name", "tiny-llama", "--repository", str(base / "artifacts"))
    assert result.exit_code == 0, result.output
    return source, Artifact.load(base / "artifacts" / "tiny-llama" / "1")


@pytest.mark.slow  # shares one import of a tiny Llama (about 15 s of CPU)
def test_a_causal_lm_imports_with_no_flags_as_text_generation(llama: tuple[Path, Artifact]) -> None:
    _, artifact = llama
    m = artifact.manifest
    assert m.task == "text-generation"
    assert [s.name for s in m.inputs][:5] == [
        "input_ids",
        "attention_mask",
        "position_ids",
        "past_key_values.0.key",
        "past_key_values.0.value",
    ]
    assert m.inputs[0].shape == ["batch", "sequence"] and m.inputs[1].shape == ["batch", "total_sequence"]
    assert m.inputs[3].shape == ["batch", 2, "past_sequence", 16]
    assert [s.name for s in m.outputs] == ["logits", *(f"present.{i}.{k}" for i in range(2) for k in ("key", "value"))]
    assert m.outputs[0].shape == ["batch", "sequence", 320]
    assert m.outputs[1].shape == ["batch", 2, "total_sequence", 16]
    g = m.generation
    assert g is not None
    assert (g.cache.layers, g.cache.kv_heads, g.cache.head_size, g.cache.dtype) == (2, 2, 16, "float32")
    assert (g.eos_token_ids, g.padding_id, g.bos_token_id, g.context_length) == ([2], 0, 1, 128)
    assert m.tokenizer is not None and m.tokenizer.padding_side == "left"
    for rel in ("tokenizer/chat_template.jinja", "generation_config.json", "tokenizer/tokenizer.json"):
        assert rel in m.files
    assert m.stages.import_ is not None and m.stages.import_.read["task"].source.startswith("config.json")


@pytest.mark.slow  # shares one import of a tiny Llama
def test_the_fp32_variant_counts_the_weights_beside_the_graph(llama: tuple[Path, Artifact]) -> None:
    from pipeline.runtime.external_data import external_files, graph_only

    _, artifact = llama
    files = artifact.manifest.files
    data = external_files(graph_only(artifact.path("model.onnx")), artifact.root)
    assert set(data) <= set(files)
    assert artifact.manifest.variants["fp32"].size == sum(files[rel].size for rel in [*data, "model.onnx"])


@pytest.mark.slow  # shares one import of a tiny Llama (about 15 s of CPU)
def test_the_gate_generated_greedy_tokens_at_three_batch_sizes(llama: tuple[Path, Artifact]) -> None:
    _, artifact = llama
    rows = artifact.manifest.stages.import_.parity["rows"]
    checks = {r["check"] for r in rows}
    for case in (
        "greedy batch 1",
        "greedy batch 2, left-padded",
        "greedy batch 4, left-padded",
        "batch 4 = rows alone",
    ):
        assert {f"{case} tokens", f"{case} logits"} <= checks
    assert all(r["passed"] for r in rows)
    logits = [r["max_abs"] for r in rows if r["check"].endswith("logits")]
    assert max(logits) < 1e-4


@pytest.mark.slow  # shares one import of a tiny Llama (about 15 s of CPU)
def test_the_artifact_generates_what_transformers_generates(llama: tuple[Path, Artifact]) -> None:
    """The graph driven from the artifact alone (its tokenizer, its generation record) continues a
    left-padded batch as transformers' generate(do_sample=False) does."""
    import torch
    from transformers import AutoModelForCausalLM

    source, artifact = llama
    m = artifact.manifest
    encoder = TextEncoder.of(artifact.root, m)
    batch = encoder.encode(["a", "The capital of Italy is", "def add"])
    assert (batch["attention_mask"][:, 0] == 0).any()  # left-padded
    g = m.generation
    got = greedy(ort_runner(artifact.path("model.onnx")), g.cache, batch["input_ids"], batch["attention_mask"], 12,
                 g.eos_token_ids, g.padding_id)  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(source).eval()
    ids = torch.from_numpy(batch["input_ids"])
    with torch.no_grad():
        want = model.generate(ids, attention_mask=torch.from_numpy(batch["attention_mask"]), max_new_tokens=12,
                              do_sample=False, pad_token_id=g.padding_id)  # fmt: skip
    np.testing.assert_array_equal(got.tokens, want[:, ids.shape[1] :].numpy())


@pytest.mark.slow  # shares one import of a tiny Llama (about 15 s of CPU)
def test_the_chat_template_and_eos_ids_are_in_the_identity(llama: tuple[Path, Artifact]) -> None:
    _, artifact = llama
    data = artifact.manifest.to_dict()
    digest = Manifest.from_dict(data).identity_digest()
    other = json.loads(json.dumps(data))
    other["generation"]["chat_template_sha256"] = "0" * 64  # another template: the file's listed hash with it
    other["files"]["tokenizer/chat_template.jinja"]["sha256"] = "0" * 64
    assert Manifest.from_dict(other).identity_digest() != digest
    other = json.loads(json.dumps(data))
    other["generation"]["eos_token_ids"] = [2, 3]
    assert Manifest.from_dict(other).identity_digest() != digest


@pytest.mark.slow  # shares one import of a tiny Llama (about 15 s of CPU)
def test_a_changed_chat_template_is_refused_on_load(llama: tuple[Path, Artifact], tmp_path: Path) -> None:
    import shutil

    _, artifact = llama
    copy = tmp_path / "tiny-llama" / "1"
    shutil.copytree(artifact.root, copy)
    (copy / "tokenizer" / "chat_template.jinja").write_text("{{ messages }}", encoding="utf-8")
    with pytest.raises(ArtifactError, match="chat_template.jinja"):
        Artifact.load(copy)


@pytest.mark.slow  # shares one import of a tiny Llama (about 15 s of CPU)
def test_a_generation_record_must_name_the_graphs_cache(llama: tuple[Path, Artifact]) -> None:
    _, artifact = llama
    data = json.loads(json.dumps(artifact.manifest.to_dict()))
    data["generation"]["cache"]["layers"] = 3
    with pytest.raises(ArtifactError, match=r"past inputs \['past_key_values.2.key'"):
        Manifest.from_dict(data)
    data = json.loads(json.dumps(artifact.manifest.to_dict()))
    del data["generation"]
    with pytest.raises(ArtifactError, match="generation: missing"):
        Manifest.from_dict(data)


@pytest.mark.slow  # shares one import of a tiny Llama
@pytest.mark.parametrize(
    ("where", "value", "refusal"),
    [
        (("context_length",), -5, r"generation.context_length: expected a number >= 1, got -5"),
        (("cache", "dtype"), "int8", r"generation.cache.dtype: 'int8' is not one of float32, float16, bfloat16"),
        (("padding_id",), -1, r"generation.padding_id: expected a number >= 0, got -1"),
        (("bos_token_id",), -2, r"generation.bos_token_id: expected a number >= 0, got -2"),
        (("eos_token_ids",), [2, -7], r"generation.eos_token_ids: token ids are >= 0, got \[-7\]"),
        (("eos_token_ids",), [2, 320], r"generation.eos_token_ids: \[320\] past the vocabulary \(ids 0..319\)"),
        (("padding_id",), 400, r"generation.padding_id: \[400\] past the vocabulary"),
        (("cache", "windows"), [8], r"generation.cache.windows: 1 windows for 2 layers"),
        (("cache", "windows"), [0, 0], r"generation.cache.windows: expected each layer's window >= 0 and at least one"),
        (("cache", "windows"), [8, -1], r"generation.cache.windows: expected each layer's window >= 0"),
    ],
)
def test_a_generation_record_edited_out_of_range_is_refused(
    llama: tuple[Path, Artifact], where: tuple[str, ...], value: object, refusal: str
) -> None:
    """A manifest edited by hand: a context length, cache dtype or token id no generation can use is refused
    when the manifest is read (pipe info, serve and export read it so), not met as a 400 at the first request."""
    _, artifact = llama
    data = json.loads(json.dumps(artifact.manifest.to_dict()))
    record = data["generation"]
    for key in where[:-1]:
        record = record[key]
    record[where[-1]] = value
    with pytest.raises(ArtifactError, match=refusal):
        Manifest.from_dict(data)


def test_text_generation_is_refused_for_an_encoder_and_an_onnx_file(tmp_path: Path) -> None:
    from tests.conftest import LINEAR

    source = tmp_path / "enc"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    (source / "model.safetensors").write_bytes(b"x")
    result = pipe("import", str(source), "--name", "enc", "--task", "text-generation", "--repository", str(tmp_path))
    assert result.exit_code == 2 and "names no *ForCausalLM" in result.output
    result = pipe("import", str(source), "--name", "enc", "--repository", str(tmp_path))
    assert result.exit_code == 2 and "not a causal LM" in result.output
    import onnx.parser

    onnx.save(onnx.parser.parse_model(LINEAR), tmp_path / "linear.onnx")
    result = pipe("import", str(tmp_path / "linear.onnx"), "--name", "lin", "--task", "text-generation",
                  "--repository", str(tmp_path))  # fmt: skip
    assert result.exit_code == 2 and "imports from its transformers directory" in result.output


@pytest.mark.slow
def test_gpt2_with_no_pad_token_imports(tmp_path: Path) -> None:
    """GPT-2: tied embeddings, no pad token (the EOS id pads), n_layer/n_head names: the same gate passes."""
    source = save_gpt2(tmp_path / "gpt2")
    result = pipe("import", str(source), "--name", "gpt2", "--repository", str(tmp_path / "artifacts"))
    assert result.exit_code == 0, result.output
    m = Artifact.load(tmp_path / "artifacts" / "gpt2" / "1").manifest
    assert m.generation is not None and m.generation.cache.kv_heads == 4
    assert all(r["passed"] for r in m.stages.import_.parity["rows"])


@pytest.mark.slow  # shares one import of a tiny Llama (about 15 s of CPU)
def test_edge_refuses_a_decoder_with_the_measured_reason(llama: tuple[Path, Artifact]) -> None:
    """Not "not yet": measured (docs/language-models.md, "Edge"), onnx2tf stops at the causal mask's Range in
    every setting and TFLite is capped at 2 GB; exit 2 before anything is converted."""
    result = pipe("export", str(llama[1].root), "--target", "edge")
    assert result.exit_code == 2, result.output
    assert "does not convert a language model" in result.output and "text-generation" in result.output
    assert "'node_arange'" in result.output and "capped at 2 GB" in result.output


@pytest.mark.slow  # shares one import of a tiny Llama
def test_pipe_info_shows_the_generation_record(llama: tuple[Path, Artifact]) -> None:
    _, artifact = llama
    g = artifact.manifest.generation
    assert g is not None and g.chat_template_sha256 is not None
    result = pipe("info", str(artifact.root))
    assert result.exit_code == 0, result.output
    assert "generation cache 2 layers x 2 KV heads x 16 (float32): 512 B per token of context per row" in result.output
    assert "inputs past_key_values.N.key|value -> outputs present.N.key|value" in result.output
    assert "stops at EOS 2; pads prompts on the left with 0; BOS 1; context 128 tokens" in result.output
    assert f"chat template tokenizer/chat_template.jinja  sha256 {g.chat_template_sha256}" in result.output


@pytest.mark.slow  # shares one import of a tiny Llama; times two rows for a fraction of a second each
def test_pipe_benchmark_times_a_decoder_as_tokens_beside_torch(
    llama: tuple[Path, Artifact], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decoder is timed as generations (time to first token, prefill and decode tokens/s), not as calls at
    batch 1 and 32; the torch row is transformers from the directory the model was imported from."""
    source, artifact = llama
    monkeypatch.setenv("COLUMNS", "250")  # a terminal wide enough that no column header wraps (rich reads it)
    copy = tmp_path / "report.json"
    result = pipe("benchmark", str(artifact.root), "--seconds", "0.2", "--json", str(copy))
    assert result.exit_code == 0, result.output
    assert "first token ms" in result.output and "decode tok/s" in result.output
    assert f"torch row: transformers from {source}" in result.output
    report = json.loads(copy.read_text())
    rows = {row["name"]: row for row in report["rows"]}
    assert list(rows) == ["torch", "fp32"] and report["not_timed"] == []
    assert report["settings"]["new_tokens"] == 16 and report["settings"]["batch"] == 1
    for row in rows.values():
        assert (
            row["timed"] and row["ttft_ms"] > 0 and row["prefill_tokens_per_s"] > 0 and row["decode_tokens_per_s"] > 0
        )
    assert rows["fp32"]["decode_x_fp32"] == rows["fp32"]["prefill_x_fp32"] == 1.0
    torch_row = rows["torch"]
    assert torch_row["decode_x_fp32"] == pytest.approx(
        torch_row["decode_tokens_per_s"] / rows["fp32"]["decode_tokens_per_s"]
    )
    record = Artifact.load(artifact.root).manifest.stages.benchmark
    assert record is not None and record.formats == ["torch", "fp32"] and record.plot is None
