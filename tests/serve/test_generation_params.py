"""A generation request's settings and the penalties the sampler applies: read as OpenAI and transformers
read them, the model's own defaults where a request is silent."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.artifact.generation import defaults_problems, read_generation
from pipeline.core.errors import InputError
from pipeline.serve.errors import RequestError
from pipeline.serve.generation.params import read_params
from pipeline.serve.generation.sampler import Sampler, Sampling, penalized


def test_the_repetition_penalty_is_transformers_own() -> None:
    import torch
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    rng = np.random.default_rng(0)
    logits = rng.standard_normal(64).astype(np.float32) * 3
    tokens = [5, 9, 9, 40, 63, 0]
    ours = penalized(logits, Sampling(repetition_penalty=1.3), tokens, prompt=3)
    theirs = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([tokens]), torch.tensor(logits)[None])[0].numpy()
    np.testing.assert_array_equal(ours, theirs)
    assert not np.array_equal(ours, logits) and np.array_equal(penalized(logits, Sampling(), tokens, 3), logits)


def test_frequency_and_presence_penalties_count_the_answer_only() -> None:
    logits = np.zeros(8, dtype=np.float32)
    # prompt [1, 2], answer [3, 3, 4]: token 3 twice, 4 once; the prompt's tokens are not penalized
    out = penalized(logits, Sampling(frequency_penalty=0.5, presence_penalty=0.25), [1, 2, 3, 3, 4], prompt=2)
    np.testing.assert_allclose(out, [0, 0, 0, -1.25, -0.75, 0, 0, 0])
    assert Sampler(Sampling(temperature=0, presence_penalty=2.0)).choose(np.array([0, 1.0, 0.5]), [0, 1], 1) == 2


def test_the_models_defaults_apply_where_a_request_is_silent() -> None:
    defaults = {"max_new_tokens": 64, "repetition_penalty": 1.1, "do_sample": True, "temperature": 0.7}
    silent = read_params({}, defaults)
    assert silent.max_tokens == 64 and silent.sampling.repetition_penalty == 1.1
    assert silent.sampling.temperature == 0.7
    asked = read_params({"max_tokens": 5, "repetition_penalty": 1.0, "temperature": None}, defaults)
    assert asked.max_tokens == 5 and asked.sampling.repetition_penalty == 1.0 and asked.sampling.temperature == 0.7
    assert read_params({}, {}).max_tokens is None  # no model limit: what the context leaves
    assert not read_params({}, {}).sampling.penalized


@pytest.mark.parametrize(
    ("body", "param"),
    [({"repetition_penalty": 0}, "repetition_penalty"), ({"repetition_penalty": "1.2"}, "repetition_penalty"),
     ({"presence_penalty": 2.5}, "presence_penalty"), ({"frequency_penalty": True}, "frequency_penalty")],
)  # fmt: skip
def test_a_penalty_out_of_range_is_a_400_naming_it(body: dict[str, object], param: str) -> None:
    with pytest.raises(RequestError) as refused:
        read_params(body, {})
    assert refused.value.status == 400 and refused.value.param == param and param in str(refused.value)


def test_defaults_no_generation_can_use_are_named() -> None:
    assert defaults_problems({"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}) == []
    problems = defaults_problems({"repetition_penalty": 0, "top_p": 1.5, "max_new_tokens": 0, "do_sample": "yes"})
    assert [p.split()[0] for p in problems] == ["repetition_penalty", "top_p", "max_new_tokens", "do_sample"]


def test_an_import_refuses_a_generation_config_no_generation_can_use(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 2, "max_position_embeddings": 64}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"repetition_penalty": 0.0, "top_k": 20}))
    with pytest.raises(InputError, match=r"generation_config.json: repetition_penalty 0.0 is not a number above 0"):
        read_generation(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"repetition_penalty": 1.05, "top_k": 20}))
    assert read_generation(tmp_path).defaults == {"repetition_penalty": 1.05, "top_k": 20}
