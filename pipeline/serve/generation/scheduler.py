"""One engine step, synchronous: admit waiting sequences, prefill a chunk of the joining prompts, then
decode one token for every running sequence in ONE onnxruntime call.

- **Admission** (between steps): waiting sequences, oldest first, join while fewer than
  `max_sequences` are active and the pool can reserve the blocks of their prompt plus their most new
  tokens (`kv_pool.py`); the oldest that does not fit blocks those behind it (no starvation). One that
  has waited `wait_s` (the server's --timeout) is removed and ends `timeout` (its handler answers 503).
- **Prefill, chunked**: the joining sequences feed at most `prefill_chunk` prompt tokens in all per
  step, the oldest first (each as much of its prompt as the chunk has left), so a long prompt stalls the
  running streams by one chunk's time per step, never by its whole length. A written decoder served
  in place (`run_in_place`: its `decode_in_place` a constant True, serve/session.py) prefills into the
  batch array's spare buffer (`BatchCache.scratch`): rows starting their prompt with the same number of
  tokens in one call, a row continuing its prompt alone, its past read from the pool (onnxruntime's
  GroupQueryAttention takes several rows of several tokens only without a past); fed `logits_from` -1,
  it computes the last column's logits only (pipeline/export/fused_decoder.py). Another graph gets the
  whole chunk in one call, rows padded on the left so each row's last prompt token is the call's last
  column, their pasts gathered from the pool, `logits_from` -1 where it takes it. When the joining
  prompts outnumber the running streams (nothing runs, or a burst arrived), more sequences wait for a
  first token than for a next one, and the step takes up to `burst_chunk` tokens (`burst_budget`: 8
  chunks, fewer when the graph's logits for that many positions would pass 512 MB): a burst of prompts
  is prefilled in one step (one call for prompts of one length) and decoded together from the next,
  instead of joining two prompts a step beside decode calls of a few rows (on the 135M bench model, 16
  prompts of 128 tokens: 9 to 18% more tokens/s, the few running streams held back once by that call).
  A row whose prompt is complete chooses its first token from its last real position's logits and runs
  from the next step on.
- **Decode**: every running sequence feeds its last token, at its own position, over its own past:
  one call for all of them, whatever their lengths (holes masked). The running rows' keys and values are
  one array the call reads in place and each new token is appended to (`batch_cache.py`): no copy of the
  cache a step, a row that ends gives its place to the last row, a row whose prompt is complete is read
  from the pool into the next free row. A written decoder served in place has each present bound to its
  past, a view of the array (`run_in_place`, engine.py), and writes the new keys and values there itself;
  another graph's presents are appended (their last column, or, where it takes `present_new_only`, as
  every call here feeds it, all of them).

The pool holds the prompts: a prefill writes its rows' new keys and values to their blocks and reads the
pasts of prompts prefilled in several chunks from them; generated tokens stay in the running batch.

Nothing of one row reaches another: the mask hides every column a row does not own, which the
equality tests prove (tests/serve/test_generation.py).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from pipeline.artifact.generation import LOGITS_FROM, PRESENT_NEW_ONLY
from pipeline.serve.generation.batch_cache import BatchCache
from pipeline.serve.generation.features import GraphFeatures
from pipeline.serve.generation.kv_pool import KVPool, PoolFull
from pipeline.serve.generation.sequence import Event, FinishReason, Sequence
from pipeline.serve.generation.settings import GenerationSettings

log = logging.getLogger("pipe.serve")

Feeds = dict[str, np.ndarray]
Run = Callable[[Feeds], list[np.ndarray]]  # feeds -> [logits, *presents in the cache's order]
# feeds, whether to keep the binding (a decode's: its pasts are bound again next step) -> logits, the new keys and
# values written into the pasts
RunInPlace = Callable[[Feeds, bool], np.ndarray]
Past = tuple[list[np.ndarray], np.ndarray]  # the past tensors of a batch's rows, and their mask [rows, width]

BURST_CHUNKS = 8  # a step whose joining prompts outnumber the running streams prefills up to this many chunks...
BURST_LOGITS_BYTES = 512 * 2**20  # ...fewer when the call's logits (every position's, fp32) would pass this


def burst_budget(prefill_chunk: int, vocab: int) -> int:
    """The prompt tokens a step may prefill when the joining prompts outnumber the running (module doc, Prefill);
    `vocab` 0 for a graph computing the last column's logits only (no cap by their size)."""
    if vocab <= 0:
        return BURST_CHUNKS * prefill_chunk
    return max(prefill_chunk, min(BURST_CHUNKS * prefill_chunk, BURST_LOGITS_BYTES // (4 * vocab)))


@dataclass(frozen=True)
class StepReport:
    """What a step did, for the metrics: rows decoded, prompt tokens prefilled, and the events made."""

    decoded: int
    prefilled: int
    events: list[tuple[Sequence, Event]]


class Scheduler:
    """The sequences of one model version: waiting, prefilling and running. The graph is called through `run`,
    or, for one whose `graph.decode_in_place`, through `run_in_place`."""

    def __init__(
        self,
        *,
        pool: KVPool,
        settings: GenerationSettings,
        graph: GraphFeatures,
        eos_ids: Iterable[int],
        run: Run,
        run_in_place: RunInPlace | None = None,
    ) -> None:
        if graph.decode_in_place and run_in_place is None:
            raise ValueError("a graph that decodes in place is called through run_in_place")
        self._run = run
        self._run_in_place = run_in_place if graph.decode_in_place else None  # every call writes into its pasts
        self._last_logits = graph.logits_from  # a prefill asks for its last column's logits only
        self._new_presents = graph.feeds_present_new_only  # every call asks for the new keys and values only
        self.cache = pool.cache
        self._past_names = self.cache.past_names()  # (made once: 60 str.format calls were 0.1 ms of every step)
        self.pool = pool
        self._eos = frozenset(eos_ids)
        self.max_sequences = settings.max_sequences
        self.prefill_chunk = settings.prefill_chunk
        # the prefill budget when the joining outnumber the running
        self.burst_chunk = burst_budget(settings.prefill_chunk, 0 if graph.logits_from else graph.vocab)
        self.wait_s = settings.wait_s  # the longest a sequence may wait for a place (perf_counter s since submitted)
        self.waiting: collections.deque[Sequence] = collections.deque()  # extended between steps (engine.py)
        self.prefilling: list[Sequence] = []
        self.running: list[Sequence] = []
        self.batch = BatchCache(self.cache, settings.max_sequences)  # the running rows' keys and values

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
            self.batch.clear()
        return StepReport(decoded, prefilled, events)

    def abort_all(self, reason: FinishReason) -> list[tuple[Sequence, Event]]:
        """Every sequence ends with `reason` (running, prefilling, then waiting), its blocks back in the pool, the
        queues and the batch emptied; the event each is told by. After a step raised (engine.py), in the thread
        that steps."""
        ended = [*self.running, *self.prefilling, *self.waiting]
        self.running, self.prefilling = [], []
        self.waiting.clear()
        self.batch.clear()
        for seq in ended:
            seq.finish = reason
            self._free(seq)
        return [(seq, Event("", seq.generated, reason)) for seq in ended]

    def _drop_cancelled(self, events: list[tuple[Sequence, Event]]) -> None:
        for group in (self.running, self.prefilling):
            for seq in group:
                if seq.cancelled:
                    seq.finish = FinishReason.CANCELLED
                    self._free(seq)
                    events.append((seq, Event("", seq.generated, FinishReason.CANCELLED)))
        self.running = [s for s in self.running if not s.cancelled]
        self.prefilling = [s for s in self.prefilling if not s.cancelled]
        for seq in [s for s in self.waiting if s.cancelled]:
            self.waiting.remove(seq)
            seq.finish = FinishReason.CANCELLED
            events.append((seq, Event("", 0, FinishReason.CANCELLED)))

    def _expire(self, events: list[tuple[Sequence, Event]]) -> None:
        """Waiting sequences past `wait_s` leave the queue (they hold no blocks yet)."""
        deadline = time.perf_counter() - self.wait_s
        for seq in [s for s in self.waiting if s.submitted < deadline]:
            self.waiting.remove(seq)
            seq.finish = FinishReason.TIMEOUT
            events.append((seq, Event("", 0, FinishReason.TIMEOUT)))

    def _admit(self) -> None:
        while self.waiting and len(self.running) + len(self.prefilling) < self.max_sequences:
            seq = self.waiting[0]
            try:
                seq.blocks = self.pool.reserve(len(seq.job.prompt) + seq.job.max_tokens)
            except PoolFull:
                return
            self.waiting.popleft()
            self.prefilling.append(seq)

    def _free(self, seq: Sequence) -> None:
        if seq.blocks.size:
            self.pool.release(seq.blocks)
            seq.blocks = np.zeros(0, dtype=np.int64)

    def _feeds(self, ids: np.ndarray, new_mask: np.ndarray, positions: np.ndarray, past: Past) -> Feeds:
        """The graph's inputs: the rows' past (and its mask), then their new tokens (holes masked)."""
        tensors, past_mask = past
        feeds: Feeds = {"input_ids": ids, "attention_mask": np.concatenate([past_mask, new_mask], axis=1),
                        "position_ids": positions}  # fmt: skip
        feeds.update(zip(self._past_names, tensors, strict=True))
        if self._new_presents:
            feeds[PRESENT_NEW_ONLY] = np.array(True)
        return feeds

    def _chunk(self) -> list[tuple[Sequence, int]]:
        """The rows of this step's prefill and the prompt tokens each feeds: the oldest first, each as much of
        its prompt as the chunk has left, so the first joiner gets its first token after its own prompt's
        time, not after everyone's (at 16 prompts of 128 tokens, a chunk of 256 shared evenly made every
        first token wait for all 2,048 tokens)."""
        burst = len(self.prefilling) > len(self.running)
        budget, chunk = self.burst_chunk if burst else self.prefill_chunk, []
        for seq in self.prefilling:
            if budget <= 0:
                break
            take = min(budget, len(seq.job.prompt) - seq.stored)
            chunk.append((seq, take))
            budget -= take
        return chunk

    def _prefill(self, events: list[tuple[Sequence, Event]]) -> int:
        chunk = self._chunk()
        if self._run_in_place is not None:
            for rows, take in _calls(chunk):
                self._prefill_call(rows, take, events)
        else:
            self._prefill_padded(chunk, events)
        return sum(take for _, take in chunk)

    def _prefill_call(self, rows: list[Sequence], take: int, events: list[tuple[Sequence, Event]]) -> None:
        """One prefill call in place: the rows' `take` next prompt tokens, their pasts (one row's, or none) and
        their new keys and values in the batch's scratch, then copied to the pool."""
        assert self._run_in_place is not None
        start = rows[0].stored
        width = start + take
        buffers = self.batch.scratch(len(rows), width)
        if start:
            self.pool.read(rows[0].blocks, start, buffers[:, 0])
        feeds: Feeds = {"input_ids": np.array([s.job.prompt[start:width] for s in rows], dtype=np.int64),
                        "attention_mask": np.ones((len(rows), width), dtype=np.int64),
                        "position_ids": np.tile(np.arange(start, width, dtype=np.int64), (len(rows), 1))}  # fmt: skip
        feeds.update(zip(self._past_names, buffers, strict=True))
        if self._last_logits:
            feeds[LOGITS_FROM] = np.array(-1, dtype=np.int64)
        logits = self._run_in_place(feeds, False)
        for i, seq in enumerate(rows):
            self._stored(seq, buffers[:, i, :, start:width], logits[i, -1], events)

    def _prefill_padded(self, chunk: list[tuple[Sequence, int]], events: list[tuple[Sequence, Event]]) -> None:
        """One prefill call of the whole chunk, rows padded on the left, the presents copied to the pool."""
        rows, takes = [seq for seq, _ in chunk], [take for _, take in chunk]
        width = max(takes)
        ids = np.zeros((len(rows), width), dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        positions = np.zeros((len(rows), width), dtype=np.int64)
        for i, (seq, n) in enumerate(zip(rows, takes, strict=True)):
            ids[i, width - n :] = seq.job.prompt[seq.stored : seq.stored + n]
            mask[i, width - n :] = 1
            positions[i] = seq.stored + np.maximum(np.arange(width) - (width - n), 0)  # padding repeats a real one
        feeds = self._feeds(ids, mask, positions, self.pool.gather([s.blocks for s in rows], [s.stored for s in rows]))
        if self._last_logits:
            feeds[LOGITS_FROM] = np.array(-1, dtype=np.int64)
        out = self._run(feeds)
        logits, presents = out[0], out[1:]
        end = presents[0].shape[2]  # the new tokens end every row (and are all of it: `present_new_only`)
        for i, (seq, n) in enumerate(zip(rows, takes, strict=True)):
            self._stored(seq, np.stack([p[i, :, end - n : end, :] for p in presents]), logits[i, -1], events)

    def _stored(self, seq: Sequence, new: np.ndarray, logits: np.ndarray, events: list[tuple[Sequence, Event]]) -> None:
        """A prefilled row's new keys and values ([2L, kv_heads, tokens, head_size]) into its pool blocks; its
        first token from its last position's `logits` when its whole prompt is in."""
        self.pool.write(seq.blocks, seq.stored, new)
        seq.stored += new.shape[2]
        if not seq.prefilling:
            events.append((seq, seq.take(seq.sampler.choose(logits, seq.tokens, len(seq.job.prompt)), self._eos)))

    def _decode(self, events: list[tuple[Sequence, Event]]) -> None:
        rows = self.running = self.batch.hold(self.running, self.pool)
        ids = np.array([[s.tokens[-1]] for s in rows], dtype=np.int64)
        positions = np.array([[s.stored] for s in rows], dtype=np.int64)
        feeds = self._feeds(ids, np.ones((len(rows), 1), dtype=np.int64), positions, self.batch.past())
        if self._run_in_place is not None:
            logits = self._run_in_place(feeds, True)
        else:
            out = self._run(feeds)
            self.batch.append(out[1:])
            logits = out[0]
        for i, seq in enumerate(rows):
            seq.stored += 1
            chosen = seq.sampler.choose(logits[i, -1], seq.tokens, len(seq.job.prompt))
            events.append((seq, seq.take(chosen, self._eos)))


def _calls(chunk: list[tuple[Sequence, int]]) -> list[tuple[list[Sequence], int]]:
    """A chunk's prefill calls in place, (rows, tokens each): onnxruntime's GroupQueryAttention takes several
    rows of several tokens only when none has a past, so rows starting their prompt with the same take go in
    one call (a burst of prompts of one length: one call), every other row alone."""
    starting: dict[int, list[Sequence]] = {}
    alone: list[tuple[list[Sequence], int]] = []
    for seq, take in chunk:
        if seq.stored:
            alone.append(([seq], take))
        else:
            starting.setdefault(take, []).append(seq)
    return [(rows, take) for take, rows in starting.items()] + alone
