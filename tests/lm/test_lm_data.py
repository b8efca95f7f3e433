"""Language-model training data: alpaca and sharegpt rows read as conversations, the chat template applied
with the loss on the answer tokens only, plain text packed into blocks, and the next-token loss."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.errors import InputError
from pipeline.data.instructions import read_conversations
from tests.lm.lm_models import save_bpe_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> object:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(save_bpe_tokenizer(tmp_path_factory.mktemp("tok")))


def write(path: Path, rows: object) -> Path:
    path.write_text(json.dumps(rows), encoding="utf-8")
    return path


def test_alpaca_rows_become_conversations(tmp_path: Path) -> None:
    rows = [
        {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
        {"instruction": "Greet.", "input": "", "output": "Hello!", "system": "Be brief."},
    ]
    assert read_conversations(write(tmp_path / "a.json", rows)) == [
        [{"role": "user", "content": "Add the numbers.\n\n2 and 3"}, {"role": "assistant", "content": "5"}],
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Greet."},
            {"role": "assistant", "content": "Hello!"},
        ],
    ]


def test_sharegpt_and_messages_rows_become_conversations(tmp_path: Path) -> None:
    lines = [
        {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]},
        {"messages": [{"role": "user", "content": "Yes?"}, {"role": "assistant", "content": "No."}]},
    ]
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n", encoding="utf-8")
    conversations = read_conversations(path)
    assert [m["role"] for m in conversations[0]] == ["user", "assistant"]
    assert conversations[1][1] == {"role": "assistant", "content": "No."}


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"instruction": "x", "output": ""}], "row 1: 'output' holds ''"),
        ([{"conversations": [{"from": "robot", "value": "x"}]}], "role 'robot' is not one of"),
        ([{"conversations": [{"from": "human", "value": "x"}]}], "no assistant turn"),
        ([{"prompt": "x", "completion": "y"}], "neither alpaca"),
    ],
)
def test_bad_rows_are_refused_by_row(tmp_path: Path, rows: object, message: str) -> None:
    with pytest.raises(InputError, match=message):
        read_conversations(write(tmp_path / "bad.json", rows))


def test_the_loss_falls_on_the_answer_tokens_only(tokenizer: object) -> None:
    from pipeline.data.lm_tokens import IGNORE, tokenize_conversations

    conversations = [
        [{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": "Paris."}],
        [{"role": "user", "content": "1, 2, 3?"}, {"role": "assistant", "content": "4, 5, 6"}],
    ]
    rows = tokenize_conversations(tokenizer, conversations, max_length=64)
    assert rows.mask[1].sum() < rows.mask[0].sum() and rows.mask[1, -1] == 0  # right-padded, padding masked
    for i, answer in enumerate(["Paris.", "4, 5, 6"]):
        labelled = rows.labels[i][rows.labels[i] != IGNORE]
        assert tokenizer.decode(labelled) == f" {answer}</s>\n"  # the answer and the turn's end, nothing else
        assert (rows.labels[i][rows.mask[i] == 0] == IGNORE).all()


def test_a_tokenizer_without_a_chat_template_is_refused(tmp_path: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    from pipeline.data.lm_tokens import tokenize_conversations

    bare = PreTrainedTokenizerFast.from_pretrained(save_bpe_tokenizer(tmp_path / "t", chat_template=None))
    with pytest.raises(InputError, match="needs the model's chat template"):
        tokenize_conversations(bare, [[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]], 8)


def test_plain_text_packs_into_labelled_blocks(tokenizer: object) -> None:
    from pipeline.data.lm_tokens import pack_text

    rows = pack_text(tokenizer, ["def add(a, b): return a + b"] * 10, block=16, eos_id=2)
    assert rows.ids.shape[1] == 16 and len(rows) >= 2
    np.testing.assert_array_equal(rows.labels, rows.ids)
    assert 2 in rows.ids  # each text ends with EOS


def test_next_token_loss_skips_unlabelled_tokens() -> None:
    import torch

    from pipeline.train.causal_lm import IGNORE, lm_loss

    logits = torch.zeros(1, 3, 4)
    logits[0, 0, 1] = 10.0  # position 0 predicts token 1 (label at position 1) confidently
    labels = torch.tensor([[IGNORE, 1, IGNORE]])
    assert lm_loss(logits, labels).item() < 1e-3
    labels = torch.tensor([[IGNORE, 2, IGNORE]])
    assert lm_loss(logits, labels).item() > 9.0
