"""A generation request's settings read from its JSON body, strictly: every wrong value is a 400 naming
the field, the value and what it takes (the OpenAI routes and Triton's generate share this).

What a request leaves out, or sends as null (OpenAI's schema makes every setting nullable, and clients send
nulls), comes from the artifact's sampling defaults (`generation.defaults`, from
generation_config.json: `do_sample: false` means greedy; its max_new_tokens, temperature, top_p, top_k and
repetition_penalty), then OpenAI's own (temperature 1, top_p 1, no penalty, as many tokens as the context
leaves).
`top_k` 0 (or -1, as vLLM spells it) keeps every token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.serve.errors import RequestError
from pipeline.serve.generation.sampler import Sampling

MAX_STOPS = 4  # OpenAI's limit on `stop`
MAX_STOP_CHARS = 256
MAX_SEED = 2**63 - 1
MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY = 0.01, 10.0  # 1 is off; above 1 repeats less, below 1 more


@dataclass(frozen=True)
class Params:
    """How to generate, as a request asked."""

    max_tokens: int | None  # None: what the context leaves
    sampling: Sampling
    stop: tuple[str, ...]
    stream: bool


def _number(body: dict[str, Any], key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise RequestError(f"{key} must be a number from {low:g} to {high:g}, got {value!r:.40}", param=key)
    return float(value)


def _whole(body: dict[str, Any], key: str, low: int, high: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RequestError(f"{key} must be a whole number from {low} to {high}, got {value!r:.40}", param=key)
    return value


def _stops(value: Any, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if (not isinstance(stops, list) or len(stops) > MAX_STOPS
            or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stops)):  # fmt: skip
        raise RequestError(
            f"{key} must be a string or a list of at most {MAX_STOPS} non-empty strings of at most "
            f"{MAX_STOP_CHARS} characters, got {value!r:.60}",
            param=key,
        )
    return tuple(stops)


def read_params(body: dict[str, Any], defaults: dict[str, Any], stop_key: str = "stop") -> Params:
    """The settings of a request body (OpenAI's names; a null is a setting left out, as OpenAI reads it)."""
    n = body.get("n")
    if n is not None and (n != 1 or isinstance(n, bool)):
        raise RequestError(f"n must be 1 (one answer per request), got {n!r:.20}; send several requests", param="n")
    stream = body.get("stream")
    stream = False if stream is None else stream
    if not isinstance(stream, bool):
        raise RequestError(f"stream must be true or false, got {stream!r:.20}", param="stream")
    tokens = _whole(body, "max_completion_tokens", 1, 10**7)
    tokens = _whole(body, "max_tokens", 1, 10**7) if tokens is None else tokens
    if tokens is None:  # the model's own limit (generation_config.json's max_new_tokens), else the context's
        tokens = defaults.get("max_new_tokens")  # (defaults are checked when the manifest is read)
    temperature = _number(body, "temperature", 0, 2)
    if temperature is None:
        greedy = defaults.get("do_sample") is False
        temperature = 0.0 if greedy else float(defaults.get("temperature", 1.0))
    top_p = _number(body, "top_p", 0, 1)
    top_p = float(defaults.get("top_p", 1.0)) if top_p is None else top_p
    if top_p == 0:
        raise RequestError(
            "top_p must be above 0 (it keeps the tokens whose probabilities add up to it)", param="top_p"
        )
    top_k = _whole(body, "top_k", -1, 10**9)
    top_k = int(defaults.get("top_k", 0) or 0) if top_k is None else max(top_k, 0)
    seed = _whole(body, "seed", -MAX_SEED, MAX_SEED)
    repetition = _number(body, "repetition_penalty", MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY)
    repetition = float(defaults.get("repetition_penalty", 1.0)) if repetition is None else repetition
    frequency = _number(body, "frequency_penalty", -2, 2)
    presence = _number(body, "presence_penalty", -2, 2)
    sampling = Sampling(temperature, top_p, top_k, None if seed is None else seed % 2**63,
                        repetition, frequency or 0.0, presence or 0.0)  # fmt: skip
    return Params(tokens, sampling, _stops(body.get(stop_key), stop_key), stream)
