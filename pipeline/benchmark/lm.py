"""`pipe benchmark` of a decoder: time to first token, prefill and decode tokens/s of every format, side by side.

A text-generation artifact is not timed per call at batch 1 and 32 like the other tasks: a person waits
for the first token (the prefill: the whole prompt, a zero-length past) and then for every further one
(a decode step: one token, the cache fed back). `pipeline.runtime.lm_speed.measure_lm` times each row's
greedy generations in the same interleaved rounds, on one prompt (the first golden prompt, its left
padding removed: batch 1), `NEW_TOKENS` decode steps each, with the same thread count for every runtime.

The rows: torch eager (the transformers model in the `CachedDecoder` wrapper the export traced: the
trained weights of a model trained here, or the directory a model was imported from, when it is still
there and hashes to the digest the import recorded; else no torch row, and a note says why), model.onnx,
and every ONNX variant (weight-only int8/int4 ...). A row that cannot load or run is listed with why.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import load_golden
from pipeline.benchmark.rows import TORCH, Row
from pipeline.core.errors import PipelineError, first_line
from pipeline.runtime.lm_speed import LmSpeed, measure_lm, ort_decoders
from pipeline.runtime.runners import Runner

NEW_TOKENS = 16  # decode steps per timed generation
TEXT_GENERATION = "text-generation"


def is_decoder(artifact: Artifact) -> bool:
    return artifact.manifest.task == TEXT_GENERATION


def decoder_rows(artifact: Artifact, rows: list[Row], notes: list[str]) -> list[Row]:
    """`rows` with the torch row of a model imported from a transformers directory added first, when that
    directory is still there unchanged (a model trained here has its torch row already); else a note."""
    notes[:] = [n for n in notes if not n.startswith("no TFLite rows")]  # a decoder has no edge form (edge.md)
    if any(row.name == TORCH for row in rows):
        return rows
    record = artifact.manifest.stages.import_
    if record is None:
        return rows
    source = Path(record.source)
    from pipeline.runtime.pretrained import source_digest

    if not (source / "config.json").is_file():
        notes[:] = [n for n in notes if not n.startswith("no torch row")]
        notes.append(f"no torch row: the directory the model was imported from ({source}) is not there any more")
        return rows
    if source_digest(source) != record.source_sha256:
        notes[:] = [n for n in notes if not n.startswith("no torch row")]
        notes.append(f"no torch row: {source} changed since the import (its sha256 is not the one recorded)")
        return rows
    notes[:] = [n for n in notes if not n.startswith("no torch row")]
    notes.append(f"torch row: transformers from {source}, the directory the model was imported from (unchanged)")
    weights = [*source.glob("*.safetensors")] or [*source.glob("*.bin")]
    torch_row = Row(TORCH, "torch", "fp32", str(source), sum(p.stat().st_size for p in weights), "reference")
    return [torch_row, *rows]


def time_decoder_rows(
    artifact: Artifact, rows: list[Row], threads: int, seconds: float, progress: Callable[[str], None]
) -> tuple[dict[str, LmSpeed], dict[str, str], dict[str, Any]]:
    """Each row's speed, the rows not timed and why, and the prompt the generations start from."""
    generation = artifact.manifest.generation
    if generation is None:  # the manifest refuses a text-generation model without it when it loads
        raise PipelineError(f"{artifact.root}: a text-generation artifact without its generation record")
    golden = load_golden(artifact).inputs
    real = golden["attention_mask"][0] == 1
    ids, mask = golden["input_ids"][:1, real], golden["attention_mask"][:1, real]
    runners: dict[str, Runner] = {}
    untimed: dict[str, str] = {}
    for row in rows:
        try:
            runners[row.name] = _runner(artifact, row, threads)
            _probe(runners[row.name], row.name, generation.cache, ids, mask)
        except PipelineError as exc:
            untimed[row.name] = first_line(exc, 300)
            runners.pop(row.name, None)
    speeds = (
        measure_lm(runners, generation.cache, ids, mask, NEW_TOKENS, threads, seconds, progress=progress)
        if runners
        else {}
    )
    prompt = {"prompt_tokens": int(ids.shape[1]), "batch": 1, "new_tokens": NEW_TOKENS}
    return speeds, untimed, prompt


def _runner(artifact: Artifact, row: Row, threads: int) -> Runner:
    if row.format == "onnx":
        return ort_decoders({row.name: artifact.path(row.file)}, threads)[row.name]
    if row.format != "torch":
        raise PipelineError(f"a decoder has no {row.format} form to time")
    return _torch_decoder(artifact, row, threads)


def _torch_decoder(artifact: Artifact, row: Row, threads: int) -> Runner:
    """The transformers model as a runner of the graph's inputs and outputs (the wrapper the export traced)."""
    try:
        import torch
        import transformers
    except ImportError:
        raise PipelineError("torch and transformers are not installed: pip install 'pipe-ml[hf]'") from None
    from pipeline.runtime.decoder import CachedDecoder
    from pipeline.runtime.runners import torch_runner

    manifest = artifact.manifest
    if manifest.lineage.backend == "import":
        from pipeline.runtime.pretrained import load_pretrained

        transformers.utils.logging.disable_progress_bar()
        model, _ = load_pretrained(transformers.AutoModelForCausalLM, Path(row.file), attn_implementation="eager")
    else:
        from pipeline.runtime.backends import backend_for

        model = backend_for(artifact).load_model(artifact)
        model = getattr(model, "net", model)  # the transformers model inside pipe's training wrapper
    decoder = CachedDecoder(model.float().eval()).eval()
    run = torch_runner(decoder, manifest.inputs, manifest.outputs)

    def threaded(inputs: dict[str, np.ndarray], /) -> dict[str, np.ndarray]:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return run(inputs)
        finally:
            torch.set_num_threads(before)

    return threaded


def _probe(run: Runner, name: str, cache: Any, ids: np.ndarray, mask: np.ndarray) -> None:
    """One prefill and one decode step before any timing: a row that cannot run is listed, not timed."""
    try:
        measure_lm({name: run}, cache, ids, mask, 1, warmup=0, min_runs=1, max_runs=1)
    except PipelineError:
        raise
    except Exception as exc:  # torch and onnxruntime raise their own types
        raise PipelineError(f"{name} cannot generate: {first_line(exc, 300)}") from exc


def speed_figures(speed: LmSpeed | None, fp32: LmSpeed | None) -> dict[str, float | None]:
    """A row's figures for the report: time to first token, tokens/s, and each ratio to model.onnx's."""
    if speed is None:
        return {}

    def ratio(mine: float, base: float | None) -> float | None:
        return mine / base if base else None

    return {
        "ttft_ms": speed.prefill_ms,
        "prefill_tokens_per_s": speed.prefill_tokens_per_s,
        "decode_tokens_per_s": speed.decode_tokens_per_s,
        "decode_ms": speed.decode_ms,
        "prefill_x_fp32": ratio(speed.prefill_tokens_per_s, fp32.prefill_tokens_per_s if fp32 else None),
        "decode_x_fp32": ratio(speed.decode_tokens_per_s, fp32.decode_tokens_per_s if fp32 else None),
        "runs": speed.runs,
    }
