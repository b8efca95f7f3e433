"""Greedy CTC decoding, the dictionary convention, the text metric and the text agreement budget, on arrays
written here (seconds): every rule of pipeline/runtime/ctc.py and its users, one test each."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.artifact.manifest import Ctc, Manifest
from pipeline.artifact.tensors import TensorSpec
from pipeline.core.errors import ArtifactError
from pipeline.runtime.ctc import PAD, characters, edit_distance, encode, greedy, sequences, text_figures
from pipeline.verify.budgets import MetricDrop, TextAgreement
from pipeline.verify.choose import GateSettings, hop_policy
from pipeline.verify.metrics import task_metric, text_metrics


def one_hot(rows: list[list[int]], classes: int = 6, p: float = 0.9) -> np.ndarray:
    """[batch, positions, classes] softmax-like scores whose best class per position is given."""
    out = np.full((len(rows), len(rows[0]), classes), (1 - p) / (classes - 1), np.float32)
    for b, row in enumerate(rows):
        for t, c in enumerate(row):
            out[b, t, c] = p
    return out


def test_greedy_merges_repeats_drops_blanks_and_averages_kept_probabilities() -> None:
    scores = one_hot([[1, 1, 0, 1, 2, 2, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0]])
    scores[0, 0] = [0.025, 0.5, 0.025, 0.4, 0.025, 0.025]  # a repeat keeps its first position's probability
    first, empty = greedy(scores)
    assert first.classes == (1, 1, 2)  # 1 1 -> 1; a blank between two 1s keeps both; 2 2 -> 2
    assert first.confidence == pytest.approx((0.5 + 0.9 + 0.9) / 3)  # kept positions 0, 3, 4, as Paddle keeps
    assert empty.classes == () and empty.confidence == 0.0  # no text: confidence 0, as Paddle's [0]


def test_logits_are_softmaxed_for_the_confidence_but_not_for_the_text() -> None:
    logits = np.log(one_hot([[2, 0, 3]])) * 3.0  # not a distribution
    (read,) = greedy(logits)
    assert read.classes == (2, 3)
    assert 0.9 < read.confidence < 1.0


def test_the_paddle_table_is_blank_then_the_dictionary_then_a_space() -> None:
    table = characters(["a", "b", "\u3000"], blank=0, space=True)
    assert table == ["", "a", "b", "\u3000", " "]
    assert greedy(one_hot([[1, 4, 3, 2]]))[0].text(table) == "a \u3000b"
    assert Ctc(space=True).classes(6623) == 6625


def test_targets_encode_with_the_table_longest_entry_first_and_refuse_unknown_characters() -> None:
    table = characters(["a", "b", "ab", "c"], space=True)
    assert encode(["ab c", "a"], table).tolist() == [[3, 5, 4], [1, PAD, PAD]]
    assert sequences(encode(["ab c", "a"], table)) == [(3, 5, 4), (1,)]
    with pytest.raises(ValueError, match=r"text 1 \('xa'\) holds 'x'"):
        encode(["a", "xa"], table)


def test_edit_distance_and_character_error_rate() -> None:
    assert edit_distance([1, 2, 3], [1, 3]) == 1
    assert edit_distance([], [4, 5]) == 2
    figures = text_figures([(1, 2, 3), (4,), ()], [(1, 2, 3), (4, 5), (6,)])
    assert (figures.exact, figures.errors, figures.characters) == (1, 2, 6)
    assert figures.agreement == pytest.approx(1 / 3) and figures.cer == pytest.approx(2 / 6)


def test_the_task_metric_reads_texts_against_target_sequences() -> None:
    outputs = one_hot([[1, 0, 2], [3, 3, 0], [0, 0, 0]])
    target = encode(["ab", "c", "a"], characters(["a", "b", "c"], space=True))
    assert task_metric("text-recognition", outputs, target) == ("text_agreement", pytest.approx(2 / 3))
    assert text_metrics(outputs, target) == {"text_agreement": pytest.approx(2 / 3), "cer": pytest.approx(1 / 4)}


def test_text_agreement_judges_a_share_and_allows_a_small_batch_one_changed_text() -> None:
    policy = TextAgreement(min_agreement=0.95)
    want = one_hot([[1, 2]] * 40)
    got = want.copy()
    got[0] = one_hot([[2, 1]])[0]
    assert policy.compare(got[:1].astype(np.float64), want[:1].astype(np.float64)).passed  # batch 1: one allowed
    assert policy.compare(got, want).passed  # 39 of 40 = 0.975
    got[1:3] = one_hot([[2, 1]] * 2)
    judged = policy.compare(got, want)  # 37 of 40 = 0.925 < 0.95
    assert not judged.passed and "texts equal 37 of 40" in judged.detail
    assert not TextAgreement(min_agreement=1.0).compare(got[:1], want[:1]).passed  # a budget of 1 allows none
    assert policy.statistic(got, want)[0] == pytest.approx(37 / 40)


@pytest.mark.parametrize(("texts", "changed"), [(16, 0), (16, 1), (16, 2), (40, 2), (40, 3), (64, 3), (64, 4)])
def test_the_gates_verdict_and_optimizes_ranking_are_one_rule(texts: int, changed: int) -> None:
    """Edge judged PP-OCRv4's 15 of 16 by `compare` (passed: one changed text allowed under 20 texts) while optimize
    ranked by `statistic` (0.9375 < 0.95: failed). Both now read `allowed`: 1 of 16, 2 of 40, 3 of 64."""
    policy = TextAgreement(min_agreement=0.95)
    want = one_hot([[1, 2]] * texts).astype(np.float64)
    got = want.copy()
    got[:changed] = one_hot([[2, 1]] * changed) if changed else got[:0]
    agreement, margin, detail = policy.statistic(got, want)
    assert policy.compare(got, want).passed == (margin >= 0) == (changed <= policy.allowed(texts))
    assert agreement == pytest.approx(1 - changed / texts)
    assert f"at most {policy.allowed(texts)} of {texts} read otherwise" in detail


def test_a_recognizer_lossy_hop_is_held_to_text_agreement_or_to_a_metric_drop_when_given_one() -> None:
    assert isinstance(hop_policy("optimize", "int8", "text-recognition", True, GateSettings()), TextAgreement)
    assert isinstance(hop_policy("optimize", "fp16", "text-recognition", False, GateSettings()), TextAgreement)
    given = GateSettings(max_accuracy_drop=0.02)
    assert hop_policy("optimize", "int8", "text-recognition", True, given) == MetricDrop(0.02)


def manifest(labels: list[str], classes: int, ctc: Ctc | None, task: str = "text-recognition") -> dict:
    out = TensorSpec("probs", "float32", ["batch", "positions", classes])
    made = Manifest(name="rec", version=1, task="tensor", inputs=[TensorSpec("x", "float32", ["batch", 4])],
                    outputs=[out], labels=labels)  # fmt: skip
    return {**made.to_dict(), "task": task, **({"ctc": {"blank": ctc.blank, "space": ctc.space}} if ctc else {})}


def test_the_manifest_holds_a_dictionary_that_makes_the_output_classes() -> None:
    assert Manifest.from_dict(manifest(["a", " ", "a"], 5, Ctc(space=True))).ctc == Ctc(space=True)  # repeats allowed
    with pytest.raises(ArtifactError, match="a dictionary of 3 entries with the blank makes 4 classes, but output"):
        Manifest.from_dict(manifest(["a", "b", "c"], 5, Ctc()))
    with pytest.raises(ArtifactError, match="ctc: a task 'text-recognition' model records"):
        Manifest.from_dict(manifest(["a", "b"], 3, None))
    with pytest.raises(ArtifactError, match="labels: class names must be distinct"):
        Manifest.from_dict(manifest(["a", "a"], 2, None, task="classification"))


def test_classifying_an_output_of_rank_three_is_refused_before_the_model_runs() -> None:
    from pipeline.serve.errors import RequestError
    from pipeline.serve.protocols.classify import check_scores
    from pipeline.serve.protocols.datatypes import IOSpec

    check_scores(IOSpec("logits", "FP32", (-1, 10)), classify=True, probabilities=False)
    with pytest.raises(RequestError, match=r"'probs' is FP32\[-1, -1, 7\]: one prediction per position"):
        check_scores(IOSpec("probs", "FP32", (-1, -1, 7)), classify=True, probabilities=False)
