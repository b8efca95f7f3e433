"""The model zoo: shapes, token models at any length, MoE routing, custom factories, checkpointing."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch

from pipeline.core.errors import InputError
from pipeline.data import DataInfo
from pipeline.recipe.schema import parse_recipe
from pipeline.train.zoo import MixtureOfExperts, build_model

FEATURES = DataInfo("features", [64], 10, [str(i) for i in range(10)], mean=[1.0] * 64, std=[2.0] * 64)
IMAGES = DataInfo("image", [1, 8, 8], 10, mean=[4.0], std=[6.0])
TOKENS = DataInfo("tokens", [32], 4, ["none", "a", "b", "both"], vocab_size=64)


def spec(arch: str, **kwargs: object):
    return parse_recipe({"name": "t", "model": {"arch": arch, **kwargs}, "data": {"source": "digits"}}).model


@pytest.mark.parametrize(("arch", "info", "x"), [
    ("mlp", FEATURES, torch.rand(5, 64)),
    ("mlp", IMAGES, torch.rand(5, 1, 8, 8)),
    ("cnn", IMAGES, torch.rand(5, 1, 8, 8)),
])  # fmt: skip
def test_feature_and_image_models_return_logits(arch: str, info: DataInfo, x: torch.Tensor) -> None:
    model = build_model(spec(arch), info).eval()
    assert model(x).shape == (5, 10)


def test_normalization_is_inside_the_model() -> None:
    torch.manual_seed(0)
    model = build_model(spec("mlp"), FEATURES).eval()
    raw = torch.rand(3, 64) * 16
    assert torch.allclose(model(raw), model.net((raw - 1.0) / 2.0))
    assert {"norm.mean", "norm.std"} <= set(model.state_dict())  # saved with the weights


@pytest.mark.parametrize("arch", ["transformer", "moe"])
def test_token_models_take_any_length_and_batch(arch: str) -> None:
    torch.manual_seed(0)
    model = build_model(spec(arch, d_model=16, heads=2, layers=2, max_len=32), TOKENS).eval()
    for batch, length in ((1, 5), (3, 17), (7, 32)):
        tokens = torch.randint(1, 64, (batch, length))
        tokens[:, -2:] = 0  # padding
        assert model(tokens).shape == (batch, 4)
    # padding does not change the result: the same sequence padded longer gives the same logits
    seq = torch.randint(5, 64, (2, 10))
    padded = torch.cat([seq, torch.zeros(2, 6, dtype=torch.long)], dim=1)
    assert torch.allclose(model(seq), model(padded), atol=1e-5)


def test_moe_routes_each_token_to_top_k_experts() -> None:
    torch.manual_seed(0)
    moe = MixtureOfExperts(d_model=8, width=16, experts=4, top_k=2, dropout=0.0).eval()
    x = torch.randn(2, 5, 8)
    logits = moe.gate(x)
    outs = torch.stack([e(x) for e in moe.experts], dim=-2)  # [B, T, E, D]
    top = logits.topk(2, dim=-1)
    weights = top.values.softmax(dim=-1)  # the sparse formulation: renormalized over the chosen two
    expected = (weights.unsqueeze(-1) * outs.gather(2, top.indices.unsqueeze(-1).expand(-1, -1, -1, 8))).sum(2)
    assert torch.allclose(moe(x), expected, atol=1e-5)


@pytest.mark.parametrize(("arch", "info", "fix"), [
    ("cnn", FEATURES, "set data.as_image: true"),
    ("transformer", FEATURES, "token sequences"),
    ("mlp", TOKENS, "use arch: transformer or moe"),
])  # fmt: skip
def test_arch_data_mismatch_names_the_fix(arch: str, info: DataInfo, fix: str) -> None:
    with pytest.raises(InputError, match=f"does not fit the data: samples are {info.kind}.*{fix}"):
        build_model(spec(arch), info)


def test_sequence_longer_than_max_len_is_refused() -> None:
    with pytest.raises(InputError, match=r"sequences are 32 tokens but model.max_len is 16; set model.max_len >= 32"):
        build_model(spec("transformer", max_len=16), TOKENS)


def test_custom_factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_models.py").write_text(
        textwrap.dedent("""
        import torch
        from pipeline.artifact.tensors import TensorSpec

        def linear(data, scale=1):
            return torch.nn.Linear(data.sample_shape[0], data.num_classes * scale)

        def with_spec(data):
            return torch.nn.Linear(64, 10), TensorSpec("input", "float32", ["batch", 32])
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    model = build_model(spec("custom", factory="my_models:linear"), FEATURES)
    assert model(torch.rand(2, 64)).shape == (2, 10)
    with pytest.raises(InputError, match=r"declares input float32 \['batch', 32\], but the data gives"):
        build_model(spec("custom", factory="my_models:with_spec"), FEATURES)
    with pytest.raises(InputError, match="cannot be loaded.*make no_such_module importable"):
        build_model(spec("custom", factory="no_such_module:f"), FEATURES)
    with pytest.raises(InputError, match=r"my_models:linear' cannot be called with model.kwargs \{'width': 3\}"):
        build_model(spec("custom", factory="my_models:linear", kwargs={"width": 3}), FEATURES)
    with pytest.raises(InputError, match=r"'math:pi' is a float, not a function"):
        build_model(spec("custom", factory="math:pi"), FEATURES)
    sys.modules.pop("my_models", None)


def test_gradient_checkpointing_gives_the_same_loss_and_gradients() -> None:
    torch.manual_seed(0)
    model = build_model(spec("moe", d_model=16, heads=2, layers=2, max_len=32, dropout=0.1), TOKENS).train()
    tokens = torch.randint(0, 64, (8, 32))
    target = torch.randint(0, 4, (8,))
    results = []
    for checkpointing in (False, True):
        model.grad_checkpointing = checkpointing
        model.zero_grad()
        torch.manual_seed(1)  # the same dropout masks (checkpoint replays the RNG state on recompute)
        loss = torch.nn.functional.cross_entropy(model(tokens), target)
        loss.backward()
        results.append((loss.item(), [p.grad.clone() for p in model.parameters()]))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert loss_a == pytest.approx(loss_b, rel=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads_a, grads_b, strict=True))
