"""One engine step, synchronous: admit waiting sequences, prefill a chunk of the joining prompts, then
decode one token for every running sequence in ONE onnxruntime call.

- **Admission** (between steps): waiting sequences, oldest first, join while fewer than
  `max_sequences` are active and the pool can reserve the blocks of their prompt plus their most new
  tokens (`kv_pool.py`); the oldest that does not fit blocks those behind it (no starvation). One that
  has waited `wait_s` (the server's --timeout) is removed and ends `timeout` (its handler answers 503).
- **Prefill, chunked**: the joining sequences feed at most `prefill_chunk` prompt tokens in all per
  step, the oldest first (each as much of its prompt as the chunk has left), as one call (rows padded
  on the left, so each row's last prompt token is the call's last column, their pasts gathered from the
  pool; a graph taking `logits_from`, a written decoder's, is fed -1 and computes the logits of that
  column only: pipeline/export/fused_decoder.py), so a long prompt stalls the running streams by one
  chunk's time per step, never by its whole length. When the joining prompts outnumber the running
  streams (nothing runs, or a burst arrived), more sequences wait for a first token than for a next
  one, and the step takes up to `burst_chunk` tokens (`burst_budget`: 8 chunks, fewer when the graph's
  logits for that many positions would pass 512 MB): a burst of prompts is prefilled in one call and
  decoded together from the next step, instead of joining two prompts a step beside decode calls of a
  few rows (on the 135M bench model, 16 prompts of 128 tokens: 9 to 18% more tokens/s, the few running
  streams held back once by that call). A row whose prompt is complete chooses its first token from
  its last real position's logits and runs from the next step on.
- **Decode**: every running sequence feeds its last token, at its own position, over its own past:
  one call for all of them, whatever their lengths (holes masked). While the running rows stay the
  same, the graph's presents of the last decode step are fed back as they are. When rows leave or
  join, each row's past is copied whole from the presents it was last in (the last decode step's for
  the rows that ran on, the last prefill call's for the rows whose prompt it completed: one copy a
  row and tensor, with that row's mask); a row in neither (its prompt completed earlier while the
  decode had other rows) is gathered from the pool, slot by slot. The whole batch is gathered again
  when the copies would carry more than a quarter of holes beside the longest row (left by rows that
  ended), which would otherwise cost attention every step. (Gathering a 135M model's 16 rows of
  ~200 tokens from the pool took about what a decode step does here, and continuous batching changes
  the rows at every join and every end.)

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
from pipeline.serve.generation.kv_pool import BLOCK, KVPool, PoolFull
from pipeline.serve.generation.sequence import CANCELLED, TIMEOUT, Event, Sequence

log = logging.getLogger("pipe.serve")

Feeds = dict[str, np.ndarray]
Run = Callable[[Feeds], list[np.ndarray]]  # feeds -> [logits, *presents in the cache's order]
Past = tuple[list[np.ndarray], np.ndarray]  # the past tensors of a batch's rows, and their mask [rows, width]
Made = tuple[list[Sequence], list[np.ndarray], np.ndarray]  # a call's rows, its presents, their mask

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
        burst_chunk: int | None = None,
        last_logits: bool = False,
    ) -> None:
        self._run = run
        self._last_logits = last_logits  # the graph takes `logits_from`: a prefill asks for its last column's only
        self.cache = cache
        self.pool = pool
        self._eos = frozenset(eos_ids)
        self.max_sequences = max_sequences
        self.prefill_chunk = prefill_chunk
        self.burst_chunk = burst_chunk or prefill_chunk  # the prefill budget when the joining outnumber the running
        self.wait_s = wait_s  # the longest a sequence may wait for a place (perf_counter seconds since submitted)
        self.waiting: collections.deque[Sequence] = collections.deque()  # extended between steps (engine.py)
        self.prefilling: list[Sequence] = []
        self.running: list[Sequence] = []
        self._hot: Made | None = None  # the last decode call
        self._joined: Made | None = None  # the last step's prefill call, when prompts completed in it

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
        prefilled, made = self._prefill(events) if self.prefilling else (0, None)
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
        self._joined = made if joined else None  # the next decode copies the joiners' pasts from it
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

    def _feeds(self, ids: np.ndarray, new_mask: np.ndarray, positions: np.ndarray, past: Past) -> Feeds:
        """The graph's inputs: the rows' past (and its mask), then their new tokens (holes masked)."""
        tensors, past_mask = past
        feeds: Feeds = {"input_ids": ids, "attention_mask": np.concatenate([past_mask, new_mask], axis=1),
                        "position_ids": positions}  # fmt: skip
        feeds.update(zip(self.cache.past_names(), tensors, strict=True))
        return feeds

    def _gather(self, rows: list[Sequence]) -> Past:
        return self.pool.gather([s.blocks for s in rows], [s.stored for s in rows])

    def _decode_past(self, rows: list[Sequence]) -> Past:
        """The running rows' past (module doc, Decode): the last decode call's presents as they are while its
        rows run on; else each row copied from the call it was last in, the rest gathered from the pool; the
        whole batch from the pool when nothing holds a row, or when the copies would be wider than the longest
        row by more than a quarter (holes of rows that ended)."""
        hot = self._hot
        if hot is not None and len(hot[0]) == len(rows) and all(a is b for a, b in zip(hot[0], rows, strict=True)):
            return hot[1], hot[2]
        made = [m for m in (hot, self._joined) if m is not None]
        where = {id(seq): (k, i) for k, (seqs, _, _) in enumerate(made) for i, seq in enumerate(seqs)}
        found = [(row, where[id(seq)]) for row, seq in enumerate(rows) if id(seq) in where]
        longest = max(seq.stored for seq in rows)
        width = max((made[k][2].shape[1] for _, (k, _) in found), default=0)
        if not found or width > longest + max(BLOCK, longest // 4):
            return self._gather(rows)
        fresh = [row for row, seq in enumerate(rows) if id(seq) not in where]
        parts = []  # (the batch's rows, the same rows in the source, its tensors, its mask)
        for m, (_, presents, made_mask) in enumerate(made):
            pairs = [(row, i) for row, (k, i) in found if k == m]
            if pairs:
                parts.append(([row for row, _ in pairs], [i for _, i in pairs], presents, made_mask))
        if fresh:
            gathered, gathered_mask = self._gather([rows[row] for row in fresh])
            parts.append((fresh, list(range(len(fresh))), gathered, gathered_mask))
        width = max(width, max(part[3].shape[1] for part in parts))
        mask = np.zeros((len(rows), width), dtype=np.int64)
        tensors = [np.empty((len(rows), p.shape[1], width, p.shape[3]), dtype=p.dtype) for p in parts[0][2]]
        for dst_rows, src_rows, presents, part_mask in parts:
            dst, src, w = _index(dst_rows), _index(src_rows), part_mask.shape[1]
            mask[dst, :w] = part_mask[src]
            for past, present in zip(tensors, presents, strict=True):
                past[dst, :, :w] = present[src]
                past[dst, :, w:] = 0  # holes hold zeros, never what the memory held
        return tensors, mask

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
            take = min(budget, len(seq.request.prompt) - seq.stored)
            chunk.append((seq, take))
            budget -= take
        return chunk

    def _prefill(self, events: list[tuple[Sequence, Event]]) -> tuple[int, Made]:
        chunk = self._chunk()
        rows, takes = [seq for seq, _ in chunk], [take for _, take in chunk]
        width = max(takes)
        ids = np.zeros((len(rows), width), dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        positions = np.zeros((len(rows), width), dtype=np.int64)
        for i, (seq, n) in enumerate(zip(rows, takes, strict=True)):
            ids[i, width - n :] = seq.request.prompt[seq.stored : seq.stored + n]
            mask[i, width - n :] = 1
            positions[i] = seq.stored + np.maximum(np.arange(width) - (width - n), 0)  # padding repeats a real one
        feeds = self._feeds(ids, mask, positions, self._gather(rows))
        if self._last_logits:
            feeds["logits_from"] = np.array(-1, dtype=np.int64)
        out = self._run(feeds)
        logits, presents = out[0], out[1:]
        end = presents[0].shape[2]  # the new tokens end every row
        for i, (seq, n) in enumerate(zip(rows, takes, strict=True)):
            new = np.stack([p[i, :, end - n : end, :] for p in presents])  # [2L, kv, n, head]
            self.pool.write(seq.blocks, seq.stored, new)
            seq.stored += n
            if not seq.prefilling:  # the whole prompt is in: its first token
                events.append((seq, seq.take(seq.sampler.choose(logits[i, -1]), self._eos)))
        return sum(takes), (rows, presents, feeds["attention_mask"])

    def _decode(self, events: list[tuple[Sequence, Event]]) -> None:
        rows = self.running
        ids = np.array([[s.tokens[-1]] for s in rows], dtype=np.int64)
        positions = np.array([[s.stored] for s in rows], dtype=np.int64)
        feeds = self._feeds(ids, np.ones((len(rows), 1), dtype=np.int64), positions, self._decode_past(rows))
        out = self._run(feeds)
        logits, presents = out[0], out[1:]
        self._hot = (list(rows), presents, feeds["attention_mask"])
        new = np.stack([p[:, :, -1, :] for p in presents])  # [2L, batch, kv, head]
        self.pool.write_last([s.blocks for s in rows], [s.stored for s in rows], new)
        for i, seq in enumerate(rows):
            seq.stored += 1
            events.append((seq, seq.take(seq.sampler.choose(logits[i, -1]), self._eos)))


def _index(rows: list[int]) -> slice | list[int]:
    """Rows as a slice when they are consecutive (numpy copies a slice without an intermediate array)."""
    if rows and rows[-1] - rows[0] + 1 == len(rows):
        return slice(rows[0], rows[-1] + 1)
    return rows
