"""The decoder written from its weights with onnxruntime's fused kernels (pipeline/export/fused_decoder.py): the
logits and presents of the model run in torch, on the inputs pipe's runtimes feed (left padding, holes in the
past, a right-padded prompt chunk after a past), for each family it writes; the families it refuses are traced."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from tests.lm.lm_models import graph_nodes, random_head_norms, save_family, save_llama


def _qwen2(directory: Path) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tests.lm.lm_models import VOCAB, save_bpe_tokenizer

    save_bpe_tokenizer(directory)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         use_sliding_window=False, tie_word_embeddings=True)  # fmt: skip
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_()  # the q, k and v biases are zeros at init: make them count
    model.save_pretrained(directory)
    return directory


def _qwen3(directory: Path) -> Path:
    """Qwen3 with query and key norms that count (ones at init: made random), heads wider than hidden / heads (32
    against 16, as real Qwen3's 128 against 64) and a window of 3 on its second layer."""
    from transformers import AutoModelForCausalLM

    save_family(directory, "qwen3", head_dim=32, use_sliding_window=True, sliding_window=3, max_window_layers=1)
    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    random_head_norms(model)
    model.save_pretrained(directory)
    return directory


def _random_norms(directory: Path) -> Path:
    """Gemma's (1 + weight) norms drawn from [-0.5, 0.5] (zeros, as at init, would hide a norm left out or its 1
    not folded in) and its weights scaled up, so that the scores and logits reach the soft caps."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(-0.5, 0.5)
            elif name.endswith(("q_proj.weight", "k_proj.weight", "embed_tokens.weight")):
                param.mul_(4)
    model.save_pretrained(directory)
    return directory


def _gemma2(directory: Path) -> Path:
    """Gemma 2 with scores and logits soft-capped where they bite, its first layer's window of 3."""
    save_family(directory, "gemma2", sliding_window=3, attn_logit_softcapping=0.5, final_logit_softcapping=1.0)
    return _random_norms(directory)


GEMMA3_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
               "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}}  # fmt: skip


def _gemma3(directory: Path) -> Path:
    """Gemma 3 with head norms, windows of 3 on its first two layers, the local base there and the global one
    scaled (linear) on the full layer, its logits soft-capped (its config's attn_logit_softcapping too, which its
    attention ignores: the graph must as well)."""
    save_family(directory, "gemma3", sliding_window=3, rope_parameters=GEMMA3_ROPE, attn_logit_softcapping=0.5,
                final_logit_softcapping=1.0)  # fmt: skip
    return _random_norms(directory)


LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32, "rope_theta": 10000.0}  # fmt: skip
SOURCES = {
    "llama": lambda d: save_llama(d),
    "llama-biases-llama3-rope": lambda d: save_llama(
        d, attention_bias=True, mlp_bias=True, rope_parameters=LLAMA3_ROPE
    ),
    "llama-one-kv-head-per-query": lambda d: save_llama(d, num_key_value_heads=4),
    "qwen2-biases-tied": _qwen2,
    # windows of 3 positions, shorter than the cases' rows and pasts (and the holes in them): every layer's
    # (Mistral), the second layer's only (Qwen2: max_window_layers 1)
    "mistral-window-3": lambda d: save_family(d, "mistral", sliding_window=3),
    "qwen2-window-3-second-layer": lambda d: save_family(d, "qwen2", sliding_window=3),
    "qwen3-head-norms-wide-heads-window-3": _qwen3,
    "phi3-packed-window-3": lambda d: save_family(d, "phi3", sliding_window=3),
    "gemma2-softcaps-window-3": _gemma2,
    "gemma3-head-norms-local-rope-softcaps-window-3": _gemma3,
}


def _load(source: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(source, attn_implementation="eager").float().eval()


def _cases(layers: int, kv: int, size: int) -> list[dict[str, np.ndarray]]:
    """A left-padded prompt batch from an empty past, and a right-padded chunk after a past with holes."""
    rng = np.random.default_rng(0)
    names = [f"past_key_values.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    empty = {n: np.zeros((3, kv, 0, size), np.float32) for n in names}
    mask = np.ones((3, 7), np.int64)
    mask[1, :3] = 0
    mask[2, :6] = 0
    first = {"input_ids": rng.integers(3, 200, (3, 7)), "attention_mask": mask,
             "position_ids": np.maximum(np.cumsum(mask, 1) - 1, 0), **empty}  # fmt: skip
    past = {n: rng.standard_normal((2, kv, 5, size)).astype(np.float32) for n in names}
    chunk_mask = np.array([[1, 0, 1, 1, 0, 1, 1, 1], [0, 0, 1, 1, 1, 1, 1, 0]], np.int64)  # holes; row 1 padded right
    chunk = {"input_ids": rng.integers(3, 200, (2, 3)), "attention_mask": chunk_mask,
             "position_ids": np.array([[4, 5, 6], [3, 4, 4]]), **past}  # fmt: skip
    return [first, chunk]


@pytest.mark.parametrize("family", sorted(SOURCES))
def test_the_fused_graph_gives_the_models_logits_and_presents(tmp_path: Path, family: str) -> None:
    import onnxruntime as ort
    import torch

    from pipeline.export.fused_decoder import refusal
    from pipeline.export.lm_module import export_decoder
    from pipeline.runtime.decoder import CachedDecoder, cache_layout

    model = _load(SOURCES[family](tmp_path / "source"))
    assert refusal(model) is None
    decoder = CachedDecoder(model).eval()
    layout = cache_layout(decoder)
    path = tmp_path / "model.onnx"
    assert export_decoder(decoder, layout, path, 18).exporter == "fused"
    ops = {node.op_type for node in graph_nodes(onnx.load(str(path)).graph)}
    assert {"SkipSimplifiedLayerNormalization", "RotaryEmbedding", "GroupQueryAttention"} <= ops
    # no traced rotation or repeated keys; no traced RMSNorm but Qwen3's and Gemma 3's head norms and Gemma's
    # post-norms, squared by Pow as the pattern onnxruntime fuses into its SimplifiedLayerNormalization
    assert not ({"Neg", "Expand"} if family.startswith(("qwen3", "gemma")) else {"Pow", "Neg", "Expand"}) & ops
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for feeds in _cases(layout.layers, layout.kv_heads, layout.head_size):
        got = session.run(None, feeds)
        with torch.no_grad():
            names = ["input_ids", "attention_mask", "position_ids", *layout.past_names()]
            want = [t.numpy() for t in decoder(*(torch.from_numpy(feeds[n]) for n in names))]
        mask = feeds["attention_mask"]
        new = mask[:, -feeds["input_ids"].shape[1] :] == 1  # padding's logits are nobody's
        np.testing.assert_allclose(got[0][new], want[0][new], atol=2e-5, rtol=1e-4)
        last = session.run(["logits"], {**feeds, "logits_from": np.array(-1, np.int64)})[0]  # the optional inputs
        np.testing.assert_array_equal(last, got[0][:, -1:])
        sequence = feeds["input_ids"].shape[1]
        only_new = session.run(None, {**feeds, "present_new_only": np.array(True)})
        np.testing.assert_array_equal(only_new[0], got[0])
        for present, whole in zip(only_new[1:], got[1:], strict=True):
            np.testing.assert_array_equal(present, whole[:, :, -sequence:])
        for present, reference in zip(got[1:], want[1:], strict=True):
            owned = (present.transpose(0, 2, 1, 3)[mask == 1], reference.transpose(0, 2, 1, 3)[mask == 1])
            np.testing.assert_allclose(*owned, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("family", sorted(SOURCES))
def test_a_decode_in_place_writes_each_rows_new_column_into_the_buffers(tmp_path: Path, family: str) -> None:
    """`decode_in_place`: three rows of 2, 5 and 3 tokens in past buffers 8 wide (holes of other values after
    them), one token each, the presents bound to the pasts' memory: each row's logits are those of the same
    row decoded alone over its exact past, its new keys and values are written at its own column, and nothing
    else in the buffers changes."""
    import onnxruntime as ort

    from pipeline.export.lm_module import export_decoder
    from pipeline.runtime.decoder import CachedDecoder, cache_layout

    decoder = CachedDecoder(_load(SOURCES[family](tmp_path / "source"))).eval()
    layout = cache_layout(decoder)
    path = tmp_path / "model.onnx"
    assert export_decoder(decoder, layout, path, 18).exporter == "fused"
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    lengths, width = np.array([2, 5, 3]), 8
    buffers = [rng.standard_normal((3, layout.kv_heads, width, layout.head_size)).astype(np.float32)
               for _ in layout.past_names()]  # fmt: skip
    before = [b.copy() for b in buffers]
    ids = rng.integers(3, 200, (3, 1))
    alone = []
    for row, n in enumerate(lengths):
        feeds = {"input_ids": ids[row : row + 1], "attention_mask": np.ones((1, n + 1), np.int64),
                 "position_ids": np.array([[n]]), **{name: b[row : row + 1, :, :n]
                 for name, b in zip(layout.past_names(), before, strict=True)}}  # fmt: skip
        alone.append(session.run(None, feeds))
    mask = np.zeros((3, width + 1), np.int64)
    mask[:, width] = 1
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    binding = session.io_binding()
    for name, value in (("input_ids", ids), ("attention_mask", mask), ("position_ids", lengths[:, None]),
                        ("decode_in_place", np.array(True))):  # fmt: skip
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value))  # an optional input too
    for past, present, buffer in zip(layout.past_names(), layout.present_names(), buffers, strict=True):
        value = ort.OrtValue.ortvalue_from_numpy(buffer)
        binding.bind_ortvalue_input(past, value)
        binding.bind_ortvalue_output(present, value)
    binding.bind_output("logits")
    session.run_with_iobinding(binding)
    logits = binding.get_outputs()[-1].numpy()
    for row, n in enumerate(lengths):
        np.testing.assert_allclose(logits[row], alone[row][0][0], atol=2e-5, rtol=1e-4)
        for buffer, old, whole in zip(buffers, before, alone[row][1:], strict=True):
            np.testing.assert_allclose(buffer[row, :, n], whole[0, :, n], atol=2e-5, rtol=1e-4)  # the new column
            kept = np.delete(buffer[row], n, axis=1), np.delete(old[row], n, axis=1)
            np.testing.assert_array_equal(*kept)


def test_families_it_cannot_write_are_traced(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from pipeline.export.fused_decoder import refusal
    from tests.lm.lm_models import save_gpt2

    gpt2 = AutoModelForCausalLM.from_pretrained(save_gpt2(tmp_path / "gpt2"))
    assert "model type 'gpt2'" in (refusal(gpt2) or "")
    dynamic = _load(save_llama(tmp_path / "dynamic", rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                                                          "rope_theta": 10000.0}))  # fmt: skip
    assert "rope scaling 'dynamic'" in (refusal(dynamic) or "")
    gelu = _load(save_llama(tmp_path / "gelu", hidden_act="gelu"))
    assert "not silu" in (refusal(gelu) or "")
    longrope = {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8, "rope_theta": 10000.0,
                "original_max_position_embeddings": 64}  # fmt: skip
    phi3_longrope = _load(save_family(tmp_path / "longrope", "phi3", rope_parameters=longrope))
    assert "rope scaling 'longrope'" in (refusal(phi3_longrope) or "")
    partial = _load(save_family(tmp_path / "partial", "phi3", partial_rotary_factor=0.5))
    assert "does not turn the whole of each head" in (refusal(partial) or "")
    gemma_gelu = _load(save_family(tmp_path / "gemma-gelu", "gemma2", hidden_activation="gelu"))
    assert "'gelu', not gelu_pytorch_tanh" in (refusal(gemma_gelu) or "")
    bidirectional = _load(save_family(tmp_path / "bidirectional", "gemma3", use_bidirectional_attention=True))
    assert "bidirectional" in (refusal(bidirectional) or "")


@pytest.mark.slow  # two exports and two gates of the tiny Llama (about 30 s)
def test_a_written_graph_that_fails_its_gate_is_traced_instead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fault put in the written graph (its lm_head scaled): the gate fails it, the import traces the model instead,
    passes, and records why."""
    import pipeline.export.lm_module as lm_module
    from pipeline.export.causal_lm import DecoderGate, import_causal_lm

    written = lm_module.write_decoder

    def faulty(model: Any, layout: Any, path: Path, opset: int) -> bool:
        external = written(model, layout, path, opset)
        proto = onnx.load(str(path))
        head = next(t for t in proto.graph.initializer if t.name == "lm_head")
        head.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(head) * 1.5, "lm_head"))
        onnx.save(proto, str(path))
        return external

    monkeypatch.setattr(lm_module, "write_decoder", faulty)
    gate = DecoderGate(steps=4, batches=(1, 2))
    artifact = import_causal_lm(save_llama(tmp_path / "source"), "tiny", tmp_path / "artifacts", gate=gate,
                                progress=lambda *_: None)  # fmt: skip
    record = artifact.manifest.stages.import_
    assert record is not None and record.settings["exporter"] == "dynamo" and record.parity["passed"]
    assert any("fused kernels failed the gate's" in note and "traced instead" in note for note in record.notes)


def test_past_the_size_limit_the_weights_are_streamed_beside_the_graph(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model past EXTERNAL_BYTES (1.8 GB; lowered here to 0 for the tiny Llama) has its weights written to
    model.onnx.data as the graph is built; the graph gives what the same model written in one file gives."""
    import onnxruntime as ort

    import pipeline.export.fused_decoder as fused
    from pipeline.runtime.decoder import CachedDecoder, cache_layout

    model = _load(save_llama(tmp_path / "source"))
    decoder = CachedDecoder(model).eval()
    layout = cache_layout(decoder)
    assert not fused.write_decoder(model, layout, tmp_path / "one.onnx", 18)
    monkeypatch.setattr(fused, "EXTERNAL_BYTES", 0)
    assert fused.write_decoder(model, layout, tmp_path / "model.onnx", 18)
    data = tmp_path / "model.onnx.data"
    assert data.stat().st_size > (tmp_path / "model.onnx").stat().st_size > 0
    onnx.checker.check_model(str(tmp_path / "model.onnx"))
    feeds = _cases(layout.layers, layout.kv_heads, layout.head_size)[1]
    one, beside = (ort.InferenceSession(str(tmp_path / n)).run(None, feeds) for n in ("one.onnx", "model.onnx"))
    for a, b in zip(one, beside, strict=True):
        np.testing.assert_array_equal(a, b)
