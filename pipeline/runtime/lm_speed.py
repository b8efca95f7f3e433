"""How fast decoders generate: prefill tokens/s and decode tokens/s of several models, timed side by side.

A decoder graph (docs/language-models.md) does two kinds of work. The **prefill** is the first step:
the whole prompt batch, a zero-length past; its time is the time to the first token (tokenizing
aside). Each **decode** step then feeds one token per row and the presents back as the pasts; its
time is what a person waits for every further token. The two are reported apart because they differ
in kind: prefill is large matrix products over many tokens, decode is a memory-bound pass over every
weight for one token per row (a weight-only int4 model can be slower to prefill and faster to decode,
or the other way round, on one CPU).

One measurement is a **generation**: the prefill, then `new_tokens` decode steps, each fed the token
greedily chosen (outside the clock), never stopping at an EOS so every model does the same work. The
machine is shared and noisy, so models are never timed alone: as in latency.py (`rounds.py`), every round runs one
generation of each model in a fresh random order (seeded), and rounds go on until each model has
`seconds` of timed steps and at least `min_runs` generations. The garbage collector is off meanwhile.

Any `Runner` is timed (pipeline/runtime/runners.py): an onnxruntime session (`ort_decoders` loads
files with the thread count asked for) or the torch wrapper of a transformers model (`pipe
benchmark`'s torch row), so the ratios between them come from one window of time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from pipeline.artifact.generation import CacheLayout
from pipeline.core.errors import ArtifactError, InputError, first_line
from pipeline.runtime.generate import first_step
from pipeline.runtime.rounds import interleaved, timing_problems
from pipeline.runtime.runners import OrtRunner, Runner
from pipeline.runtime.session import create_session


@dataclass(frozen=True)
class LmSpeed:
    """One decoder's generation speed on one prompt batch (medians over the timed generations)."""

    batch: int  # prompt rows per call
    prompt_tokens: int  # tokens per row of the prompt (padding included): what the prefill processes
    new_tokens: int  # decode steps per generation
    prefill_ms: float  # median time of the first step: the time to the first token, tokenizing aside
    decode_ms: float  # median time of one decode step (one new token per row)
    prefill_tokens_per_s: float  # batch x prompt_tokens / prefill seconds
    decode_tokens_per_s: float  # batch / decode-step seconds: new tokens a second, all rows together
    runs: int  # timed generations (warm-up excluded)
    threads: int  # the threads each model ran with

    def to_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}


def ort_decoders(paths: Mapping[str, Path], threads: int = 1) -> dict[str, Runner]:
    """A CPU onnxruntime session per decoder file, `threads` intra-op threads, fed as the graph names its inputs."""
    if threads < 1:
        raise InputError(f"threads is {threads}; give 1 or more")
    return {
        name: OrtRunner(create_session(path, "cpu", intra_op_threads=threads, inter_op_threads=1))
        for name, path in paths.items()
    }


def measure_lm(
    models: Mapping[str, Runner],
    cache: CacheLayout,
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    new_tokens: int = 16,
    threads: int = 1,
    seconds: float = 2.0,
    warmup: int = 1,
    min_runs: int = 3,
    max_runs: int = 200,
    progress: Callable[[str], None] | None = None,
) -> dict[str, LmSpeed]:
    """Prefill and decode speed of each decoder on one left-padded prompt batch (ids, mask [B, T] int64),
    all timed side by side; see the module doc. `threads` is recorded (the caller made the runners)."""
    _check(models, input_ids, attention_mask, new_tokens, threads, seconds, warmup, min_runs, max_runs)
    say = progress or (lambda _message: None)
    ids, mask = np.ascontiguousarray(input_ids, dtype=np.int64), np.ascontiguousarray(attention_mask, dtype=np.int64)
    names = list(models)
    say(
        f"lm speed: {len(names)} model(s), batch {len(ids)} x {ids.shape[1]} prompt tokens, {new_tokens} new tokens, "
        f"{seconds:g} s of runs each"
    )
    for _ in range(warmup):
        for name in names:
            _generation(name, models[name], cache, ids, mask, new_tokens)
    runs = interleaved(
        names, lambda name: _generation(name, models[name], cache, ids, mask, new_tokens), seconds, min_runs, max_runs
    )
    prefill = {name: [steps[0] for steps in runs[name]] for name in names}
    decode = {name: [step for steps in runs[name] for step in steps[1:]] for name in names}
    return {name: _speed(prefill[name], decode[name], ids.shape, new_tokens, threads) for name in names}


def _generation(
    name: str, run: Runner, cache: CacheLayout, ids: np.ndarray, mask: np.ndarray, new_tokens: int
) -> list[int]:
    """Nanoseconds of each step of one greedy generation: the prefill, then `new_tokens` decode steps."""
    batch = len(ids)
    feed = first_step(ids, mask, cache)
    pos = feed["position_ids"][:, -1:]
    times = []
    try:
        for step in range(new_tokens + 1):
            begin = time.perf_counter_ns()
            out = run(feed)
            times.append(time.perf_counter_ns() - begin)
            if step == new_tokens:
                break
            chosen = out["logits"][:, -1].argmax(axis=-1).astype(np.int64)[:, None]
            mask = np.concatenate([mask, np.ones((batch, 1), dtype=np.int64)], axis=1)
            pos = pos + 1
            past = dict(zip(cache.past_names(), (out[n] for n in cache.present_names()), strict=True))
            feed = {"input_ids": chosen, "attention_mask": mask, "position_ids": pos, **past}
    except Exception as exc:  # onnxruntime's exception types share no base class; a graph lacking an output
        raise ArtifactError(f"decoder {name!r} failed to generate: {first_line(exc)}") from exc
    return times


def _speed(prefill: list[int], decode: list[int], shape: tuple[int, ...], new_tokens: int, threads: int) -> LmSpeed:
    batch, prompt = int(shape[0]), int(shape[1])
    prefill_ms = float(np.median(prefill)) / 1e6
    decode_ms = float(np.median(decode)) / 1e6 if decode else float("nan")
    return LmSpeed(
        batch=batch,
        prompt_tokens=prompt,
        new_tokens=new_tokens,
        prefill_ms=prefill_ms,
        decode_ms=decode_ms,
        prefill_tokens_per_s=batch * prompt / (prefill_ms / 1e3),
        decode_tokens_per_s=batch / (decode_ms / 1e3) if decode else float("nan"),
        runs=len(prefill),
        threads=threads,
    )


def _check(
    models: Mapping[str, Runner],
    ids: np.ndarray,
    mask: np.ndarray,
    new_tokens: int,
    threads: int,
    seconds: float,
    warmup: int,
    min_runs: int,
    max_runs: int,
) -> None:
    """Refuse settings that would time nothing, or forever, before anything runs (every problem at once)."""
    problems = []
    if not models:
        problems.append("no models to time")
    if np.ndim(ids) != 2 or np.shape(ids) != np.shape(mask) or np.size(ids) == 0:
        problems.append(
            f"input_ids {np.shape(ids)} and attention_mask {np.shape(mask)} must be one non-empty [batch, tokens] shape"
        )
    if new_tokens < 1:
        problems.append(f"new_tokens is {new_tokens}; give 1 or more (decode is timed on them)")
    problems += timing_problems(threads, seconds, warmup, min_runs, max_runs)
    if problems:
        raise InputError("lm speed: " + "; ".join(problems))
