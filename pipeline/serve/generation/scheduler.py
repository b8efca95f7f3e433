"""One engine step, synchronous: admit waiting sequences, prefill a chunk of the joining prompts, then
decode one token for every running sequence in ONE onnxruntime call.

- **Admission** (between steps): waiting sequences, oldest first, join while fewer than
  `max_sequences` are active and the pool can reserve the blocks of their prompt plus their most new
  tokens (`kv_pool.py`); the oldest that does not fit blocks those behind it (no starvation). One that
  has waited `wait_s` (the server's --timeout) is removed and ends `timeout` (its handler answers 503).
- **Prefill, chunked**: the joining sequences feed at most `prefill_chunk` prompt tokens in all per
  step, the oldest first (each as much of its prompt as the chunk has left), as one call (rows padded
  on the right, their pasts gathered from the pool), so a long prompt stalls the running streams by one
  chunk's time per step, never by its whole length. A row whose
  prompt is complete chooses its first token from its last real position's logits and runs from the
  next step on.
- **Decode**: every running sequence feeds its last token, at its own position, over its own past:
  one call for all of them, whatever their lengths (holes masked). The past is gathered from the pool
  when the running rows changed since the last decode step; while they stay the same, the graph's
  presents of that step are fed back as they are (they hold the same values, and gathering a 135M
  model's 16 rows of 256 tokens costs about what the step itself does here).

The graph's presents are written back to each row's blocks (only the new tokens' keys and values).
Nothing of one row reaches another: the mask hides every column a row does not own, which the
equality tests prove (tests/serve/test_generation.py).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pipeline.artifact.generation import CacheLayout
from pipeline.serve.generation.kv_pool import KVPool, PoolFull
from pipeline.serve.generation.sequence import CANCELLED, TIMEOUT, Event, Sequence

log = logging.getLogger("pipe.serve")

Feeds = dict[str, np.ndarray]
Run = Callable[[Feeds], list[np.ndarray]]  # feeds -> [logits, *presents in the cache's order]


@dataclass(frozen=True)
class StepReport:
    """What a step did, for the metrics: rows decoded, prompt tokens prefilled, and the events made."""

    decoded: int
    prefilled: int
    events: list[tuple[Sequence, Event]]


class Scheduler:
    """The sequences of one model version: waiting, prefilling and running."""

    def __init__(
        self,
        run: Run,
        cache: CacheLayout,
        pool: KVPool,
        eos_ids: list[int],
        max_sequences: int,
        prefill_chunk: int,
        wait_s: float = float("inf"),
    ) -> None:
        self._run = run
        self.cache = cache
        self.pool = pool
        self._eos = frozenset(eos_ids)
        self.max_sequences = max_sequences
        self.prefill_chunk = prefill_chunk
        self.wait_s = wait_s  # the longest a sequence may wait for a place (perf_counter seconds since submitted)
        self.waiting: collections.deque[Sequence] = collections.deque()  # extended between steps (engine.py)
        self.prefilling: list[Sequence] = []
        self.running: list[Sequence] = []
        self._hot: tuple[list[Sequence], list[np.ndarray], np.ndarray] | None = None  # rows, presents, mask

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.prefilling or self.running)

    def step(self) -> StepReport:
        """One step: drop the cancelled and those that waited too long, admit, prefill a chunk, decode every
        running row."""
        events: list[tuple[Sequence, Event]] = []
        self._drop_cancelled(events)
        self._expire(events)
        self._admit()
        prefilled = self._prefill(events) if self.prefilling else 0
        decoded = len(self.running)
        if self.running:
            self._decode(events)
        for seq, event in events:
            if event.finish is not None:
                self._free(seq)
        self.running = [s for s in self.running if s.finish is None]
        self.prefilling = [s for s in self.prefilling if s.finish is None]
        joined = [s for s in self.prefilling if not s.prefilling]
        self.prefilling = [s for s in self.prefilling if s.prefilling]
        self.running += joined
        if not self.running:
            self._hot = None  # nothing runs: let the last presents go
        return StepReport(decoded, prefilled, events)

    def _drop_cancelled(self, events: list[tuple[Sequence, Event]]) -> None:
        for group in (self.running, self.prefilling):
            for seq in group:
                if seq.cancelled:
                    seq.finish = CANCELLED
                    self._free(seq)
                    events.append((seq, Event("", seq.generated, CANCELLED)))
        self.running = [s for s in self.running if not s.cancelled]
        self.prefilling = [s for s in self.prefilling if not s.cancelled]
        for seq in [s for s in self.waiting if s.cancelled]:
            self.waiting.remove(seq)
            seq.finish = CANCELLED
            events.append((seq, Event("", 0, CANCELLED)))

    def _expire(self, events: list[tuple[Sequence, Event]]) -> None:
        """Waiting sequences past `wait_s` leave the queue (they hold no blocks yet)."""
        deadline = time.perf_counter() - self.wait_s
        for seq in [s for s in self.waiting if s.submitted < deadline]:
            self.waiting.remove(seq)
            seq.finish = TIMEOUT
            events.append((seq, Event("", 0, TIMEOUT)))

    def _admit(self) -> None:
        while self.waiting and len(self.running) + len(self.prefilling) < self.max_sequences:
            seq = self.waiting[0]
            try:
                seq.blocks = self.pool.reserve(len(seq.request.prompt) + seq.request.max_tokens)
            except PoolFull:
                return
            self.waiting.popleft()
            self.prefilling.append(seq)

    def _free(self, seq: Sequence) -> None:
        if seq.blocks.size:
            self.pool.release(seq.blocks)
            seq.blocks = np.zeros(0, dtype=np.int64)

    def _feeds(self, rows: list[Sequence], ids: np.ndarray, new_mask: np.ndarray, positions: np.ndarray) -> Feeds:
        """The graph's inputs: each row's past from the pool, then its new tokens (holes masked)."""
        past, past_mask = self.pool.gather([s.blocks for s in rows], [s.stored for s in rows])
        feeds: Feeds = {"input_ids": ids, "attention_mask": np.concatenate([past_mask, new_mask], axis=1),
                        "position_ids": positions}  # fmt: skip
        feeds.update(zip(self.cache.past_names(), past, strict=True))
        return feeds

    def _chunk(self) -> list[tuple[Sequence, int]]:
        """The rows of this step's prefill and the prompt tokens each feeds: the oldest first, each as much of
        its prompt as the chunk has left, so the first joiner gets its first token after its own prompt's
        time, not after everyone's (at 16 prompts of 128 tokens, a chunk of 256 shared evenly made every
        first token wait for all 2,048 tokens)."""
        budget, chunk = self.prefill_chunk, []
        for seq in self.prefilling:
            if budget <= 0:
                break
            take = min(budget, len(seq.request.prompt) - seq.stored)
            chunk.append((seq, take))
            budget -= take
        return chunk

    def _prefill(self, events: list[tuple[Sequence, Event]]) -> int:
        chunk = self._chunk()
        rows, takes = [seq for seq, _ in chunk], [take for _, take in chunk]
        width = max(takes)
        ids = np.zeros((len(rows), width), dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        positions = np.zeros((len(rows), width), dtype=np.int64)
        for i, (seq, n) in enumerate(zip(rows, takes, strict=True)):
            ids[i, :n] = seq.request.prompt[seq.stored : seq.stored + n]
            mask[i, :n] = 1
            positions[i] = seq.stored + np.minimum(np.arange(width), n - 1)  # padding repeats a real position
        out = self._run(self._feeds(rows, ids, mask, positions))
        logits, presents = out[0], out[1:]
        start = presents[0].shape[2] - width  # the new tokens' first column
        for i, (seq, n) in enumerate(zip(rows, takes, strict=True)):
            new = np.stack([p[i, :, start : start + n, :] for p in presents])  # [2L, kv, n, head]
            self.pool.write(seq.blocks, seq.stored, new)
            seq.stored += n
            if not seq.prefilling:  # the whole prompt is in: its first token
                events.append((seq, seq.take(seq.sampler.choose(logits[i, n - 1]), self._eos)))
        return sum(takes)

    def _decode(self, events: list[tuple[Sequence, Event]]) -> None:
        rows = self.running
        ids = np.array([[s.tokens[-1]] for s in rows], dtype=np.int64)
        positions = np.array([[s.stored] for s in rows], dtype=np.int64)
        new_mask = np.ones((len(rows), 1), dtype=np.int64)
        hot = self._hot
        if hot is not None and len(hot[0]) == len(rows) and all(a is b for a, b in zip(hot[0], rows, strict=True)):
            feeds: Feeds = {"input_ids": ids, "attention_mask": np.concatenate([hot[2], new_mask], axis=1),
                            "position_ids": positions}  # fmt: skip
            feeds.update(zip(self.cache.past_names(), hot[1], strict=True))
        else:
            feeds = self._feeds(rows, ids, new_mask, positions)
        out = self._run(feeds)
        logits, presents = out[0], out[1:]
        self._hot = (list(rows), presents, feeds["attention_mask"])
        new = np.stack([p[:, :, -1, :] for p in presents])  # [2L, batch, kv, head]
        self.pool.write_last([s.blocks for s in rows], [s.stored for s in rows], new)
        for i, seq in enumerate(rows):
            seq.stored += 1
            events.append((seq, seq.take(seq.sampler.choose(logits[i, -1]), self._eos)))
