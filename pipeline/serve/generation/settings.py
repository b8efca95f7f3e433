"""`pipe serve`'s settings for text-generation models (flags `--kv-cache-mb`, `--max-sequences`,
`--max-waiting`, `--prefill-chunk`, and `--timeout` as the bound of a wait)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GenerationSettings:
    """Per model version."""

    kv_cache_mb: float = 512.0  # the KV pool's arena; a sequence waits for blocks, or is refused if it never fits
    max_sequences: int = 32  # sequences decoded together (one onnxruntime call a step)
    max_waiting: int = 64  # requests waiting for a place; more are refused with 503 + Retry-After
    prefill_chunk: int = 256  # prompt tokens prefilled per step, over every joining prompt
    wait_s: float = 30.0  # a request waiting longer for a place is removed and answered 503 (--timeout)
