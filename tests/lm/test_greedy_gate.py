"""The generation gate's rows on arrays made here: a differing token fails, logits are judged only while
both runs continue the same text, and a row's EOS ends its comparison."""

from __future__ import annotations

import numpy as np

from pipeline.runtime.generate import Generated, ended, positions, stitch
from pipeline.verify.generation import greedy_rows


def run(tokens: list[list[int]], logits: np.ndarray | None = None, eos: int = 2) -> Generated:
    t = np.array(tokens, dtype=np.int64)
    values = logits if logits is not None else np.zeros((*t.shape, 4), dtype=np.float32)
    return Generated(t, values, ended(t, [eos]))


def test_equal_runs_pass() -> None:
    rows = greedy_rows("greedy batch 2", run([[3, 1], [1, 3]]), run([[3, 1], [1, 3]]), 1e-4, 1e-3)
    assert [r.passed for r in rows] == [True, True]


def test_a_differing_token_fails_and_names_where() -> None:
    tokens, logits = greedy_rows("b", run([[3, 1, 1], [1, 3, 3]]), run([[3, 1, 1], [1, 1, 3]]), 1e-4, 1e-3)
    assert not tokens.passed and tokens.detail == "row 1, token 1: onnx 1, reference 3"
    assert logits.passed  # compared up to the differing token only


def test_logits_past_tolerance_fail() -> None:
    drift = np.zeros((1, 2, 4), dtype=np.float32)
    drift[0, 1, 0] = 0.01
    _, logits = greedy_rows("b", run([[3, 1]]), run([[3, 1]], drift), 1e-4, 1e-3)
    assert not logits.passed and logits.max_abs == np.float32(0.01)


def test_a_row_ends_at_its_eos() -> None:
    """After EOS the batch run keeps computing a finished row; the row run alone stopped: not compared."""
    late = np.zeros((1, 3, 4), dtype=np.float32)
    late[0, 2] = 5.0
    alone = stitch([run([[3, 2]])], padding_id=0)
    tokens, logits = greedy_rows("alone", alone, run([[3, 2, 0]], late), 1e-4, 1e-3)
    assert tokens.passed and logits.passed


def test_positions_count_real_tokens_of_a_left_padded_row() -> None:
    mask = np.array([[0, 0, 1, 1], [1, 1, 1, 1]])
    np.testing.assert_array_equal(positions(mask), [[1, 1, 0, 1], [0, 1, 2, 3]])
