"""Every decoder family right past its sliding window: a tiny random model of each (tests/lm/lm_models.py:
FAMILIES, an 8-token window) through `pipe import`, whose gate now tries the lengths users send, then served
by pipe serve's engine at prompts past the window with decodes across it, each answer equal to transformers'
greedy generate. Random weights judge parity only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pipeline.artifact.directory import Artifact
from pipeline.cli.group import main
from pipeline.serve.generation.served import TextGenerator
from pipeline.serve.generation.settings import GenerationSettings
from pipeline.serve.session import ModelSession, SessionOptions
from tests.lm.greedy_runs import engine_greedy, transformers_greedy
from tests.lm.lm_models import FAMILIES, WINDOW, save_family

pytestmark = pytest.mark.slow  # an import of a tiny model, about 12 s of CPU, per family

NEW_TOKENS = 30  # each decode crosses the window three times
PROMPT_LENGTHS = (6, 3 * WINDOW + 1, 90)  # inside the window, past it, past it many times over
# The families pipeline/export/fused_decoder.py writes (exporter "fused"), the others traced ("dynamo"). A
# written graph that failed the gate would be traced instead (causal_lm.py `_export_judged`) and pass: the
# exporter is asserted so that fallback cannot hide a fault in the writer.
WRITTEN = frozenset({"gemma2", "gemma3", "mistral", "phi3", "qwen2", "qwen3"})


def imported(tmp_path: Path, family: str, **config: Any) -> tuple[Path, Any]:
    """`pipe import` of a tiny `family` model: the source directory and the CLI's result."""
    source = save_family(tmp_path / family, family, **config)
    result = CliRunner().invoke(main, ["import", str(source), "--name", family, "--repository", str(tmp_path / "repo")])
    return source, result


def served_greedy(version: Path, prompts: list[list[int]], steps: int) -> list[list[int]]:
    """The prompts submitted together to pipe serve's engine (prefill chunks of 16: rows join while others
    decode, and the batch cache holds holes between a row's tokens and its new one); each one's new tokens."""
    manifest = Artifact.load(version).manifest
    session = ModelSession(version / "model.onnx", SessionOptions("cpu", 1, 1, False), manifest).session
    made = TextGenerator.of(version, manifest, session, GenerationSettings(prefill_chunk=16), None)
    assert made is not None
    answers = engine_greedy(made, prompts, steps)
    assert made.engine.pool.used_blocks == 0
    return answers


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_imports_gated_at_length_and_serves_past_its_window_as_transformers(
    tmp_path: Path, family: str
) -> None:
    source, result = imported(tmp_path, family)
    assert result.exit_code == 0, result.output
    version = tmp_path / "repo" / family / "1"
    record = json.loads((version / "manifest.json").read_text())["stages"]["import"]
    assert record["settings"]["exporter"] == ("fused" if family in WRITTEN else "dynamo"), record["notes"]
    parity = record["parity"]
    rows = {row["check"]: row for row in parity["rows"]}
    assert rows["teacher-forced 256 tokens"]["passed"]  # the context (256) is shorter than LONG_TOKENS
    windows = {
        "gemma3": [8, 8, 0],
        "gemma2": [8, 0],
        "mistral": [8, 8],
        "qwen2": [0, 8],
        "qwen3": [0, 8],
        "phi3": [8, 8],
    }
    assert Artifact.load(version).manifest.generation.cache.windows == windows.get(family)
    assert any(check.startswith("greedy across the window") or check.startswith("greedy long") for check in rows)

    prompts = [[1, *range(10, 9 + n)] for n in PROMPT_LENGTHS]
    served = served_greedy(version, prompts, NEW_TOKENS)
    for ids, answer in zip(prompts, served, strict=True):
        assert answer == transformers_greedy(source, ids, NEW_TOKENS, eos=2), (family, len(ids))


def test_a_graph_that_ignores_its_window_is_refused_at_the_token_it_first_differs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A window of 64 that the graph leaves out: right for the gate's short prompts (18 tokens and 16 new ones),
    wrong from token 65 on. The long cases refuse it and name that token."""
    import pipeline.export.lm_module as lm_module
    import pipeline.runtime.decoder as decoder

    window_masks = decoder.window_masks

    def unwindowed(mask: Any, positions: Any, sequence: int, windows: Any, dtype: Any) -> Any:
        return window_masks(mask, positions, sequence, decoder.Windows(10**9, windows.by_layer_type), dtype)

    monkeypatch.setattr(decoder, "window_masks", unwindowed)
    monkeypatch.setattr(lm_module, "refusal", lambda model: "traced here: the window is the mask's")
    _, result = imported(tmp_path, "mistral", sliding_window=64)
    assert result.exit_code == 1, result.output
    assert "first differs at token 65 of 256" in result.output
    assert "greedy batch" not in result.output and "first step" not in result.output  # only failures are listed
    assert not (tmp_path / "repo" / "mistral").exists()  # nothing half-written


def test_a_written_graph_that_ignores_its_window_is_traced_instead_naming_the_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer (pipeline/export/fused_decoder.py) made to leave Mistral's window of 64 out: the long case
    fails the written graph at token 65, and the import keeps the traced one, saying why."""
    from dataclasses import replace

    import pipeline.export.lm_module as lm_module

    written = lm_module.write_decoder

    def unwindowed(model: Any, layout: Any, path: Path, opset: int) -> bool:
        return written(model, replace(layout, windows=None), path, opset)

    monkeypatch.setattr(lm_module, "write_decoder", unwindowed)
    _, result = imported(tmp_path, "mistral", sliding_window=64)
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "repo" / "mistral" / "1" / "manifest.json").read_text())["stages"]["import"]
    assert record["settings"]["exporter"] == "dynamo" and record["parity"]["passed"]
    failed = [note for note in record["notes"] if "fused kernels failed" in note]
    assert failed and "first differs at token 65 of 256" in failed[0]


def test_a_variant_broken_past_the_window_fails_optimizes_long_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pipe optimize's judge reads every variant at the gate's length too: a graph of the same weights that
    leaves a 64-token window out equals model.onnx on the held-out prompts (all shorter than the window) and
    fails the long text, by the lossless policy a graph-only variant is held to."""
    import pipeline.runtime.decoder as decoder
    from pipeline.artifact.golden import load_golden
    from pipeline.export.lm_module import export_decoder
    from pipeline.optimize.decoder import DecoderJudge
    from pipeline.verify.policies import Exact

    source, result = imported(tmp_path, "mistral", sliding_window=64)
    assert result.exit_code == 0, result.output
    version = tmp_path / "repo" / "mistral" / "1"
    artifact = Artifact.load(version)
    window_masks = decoder.window_masks
    monkeypatch.setattr(decoder, "window_masks", lambda mask, positions, sequence, windows, dtype: window_masks(
        mask, positions, sequence, decoder.Windows(10**9, windows.by_layer_type), dtype))  # fmt: skip
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source, attn_implementation="eager").float().eval()
    broken = tmp_path / "broken.onnx"
    cache = artifact.manifest.generation.cache
    export_decoder(decoder.CachedDecoder(model).eval(), cache, broken, 18, fused=False)  # traced: the mask's window
    judge = DecoderJudge(artifact, version / "model.onnx", load_golden(artifact).inputs, Exact(), Exact())
    rows = {row.check: row for row in judge(broken, Exact(), tmp_path).report.rows}
    assert rows["teacher-forced next tokens"].passed  # the held-out prompts: within the window
    assert not rows["teacher-forced 256 tokens"].passed, rows["teacher-forced 256 tokens"]
    assert rows["teacher-forced 256 tokens"].share  # a share of its logits out of tolerance
