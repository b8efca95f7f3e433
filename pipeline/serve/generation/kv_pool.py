"""The KV cache pool: every sequence's keys and values, in fixed-size blocks of one preallocated arena.

The arena holds `blocks` blocks of BLOCK token slots for every past tensor of the graph: one float
array [2 x layers, kv_heads, blocks x BLOCK, head_size] (the manifest's cache layout: `bytes_per_token`
x BLOCK a block). Its size is a setting (`--kv-cache-mb`), so the memory the cache may take is fixed
when the model loads. A sequence reserves, when it is admitted, the blocks its prompt and its most new
tokens can fill, so it never runs short mid-generation; a sequence that could not fit even an empty
pool is refused at once, and one that does not fit now waits until others free their blocks.

`gather` copies the rows' slots into the graph's past tensors, [batch, kv_heads, width, head_size]
each, width the longest row: a shorter row's tail is a hole the attention mask marks 0 (its
positions are given explicitly, so a hole changes nothing: softmax gives a masked column exactly 0).
The copy is one `np.take` per past tensor and head into the output (measured here on a 135M-shaped
cache, 16 rows of 256 tokens: 0.49 s where a fancy index and a transpose took 1.1 s, on a loaded
machine); the scheduler gathers only a prefill's rows (a prompt's earlier chunks). A prompt stays in
its blocks: a row whose prompt is complete is `read` into the running batch (batch_cache.py), which
keeps the tokens it generates. The blocks reserved for those stay reserved, unused, so the pool still
bounds the tokens the admitted sequences may reach; the batch's array, beside it, holds the running rows'
whole caches (every row as wide as the longest and a few columns more). The arena is
zeroed when the model loads, every page written then: left to the first requests, taking the pages
from the system cost the first burst of 16 streams on the 135M bench model 0.75 s of its prefill
writes (first-touching 512 MB took 0.15-0.9 s here), so the memory the pool takes is taken at load,
as the flag says. Holes hold finite values, never NaN, so 0 x hole is 0.
"""

from __future__ import annotations

import numpy as np

from pipeline.artifact.generation import CacheLayout

BLOCK = 16  # tokens per block


class PoolFull(Exception):
    """No blocks for this sequence now (it waits); raised by `reserve`."""


class KVPool:
    """Blocks of the arena, reserved per sequence and freed when it ends."""

    def __init__(self, cache: CacheLayout, budget_bytes: int) -> None:
        self.cache = cache
        self.bytes_per_block = cache.bytes_per_token() * BLOCK
        self.blocks = max(1, budget_bytes // self.bytes_per_block)
        shape = (2 * cache.layers, cache.kv_heads, self.blocks * BLOCK, cache.head_size)
        self.arena = np.empty(shape, dtype=np.dtype(cache.dtype))
        self.arena.fill(0)  # every page taken now (module doc)
        self._free = list(range(self.blocks - 1, -1, -1))  # a stack: low blocks first

    @property
    def capacity_tokens(self) -> int:
        return self.blocks * BLOCK

    @property
    def used_blocks(self) -> int:
        return self.blocks - len(self._free)

    @property
    def usage(self) -> float:
        """The share of the arena reserved now, 0..1."""
        return self.used_blocks / self.blocks

    @staticmethod
    def blocks_for(tokens: int) -> int:
        return -(-tokens // BLOCK)

    def reserve(self, tokens: int) -> np.ndarray:
        """Blocks for `tokens` tokens (their ids, in order); PoolFull when the arena has too few free now."""
        needed = self.blocks_for(tokens)
        if needed > len(self._free):
            raise PoolFull(f"{needed} blocks wanted, {len(self._free)} free")
        return np.array([self._free.pop() for _ in range(needed)], dtype=np.int64)

    def release(self, blocks: np.ndarray) -> None:
        self._free.extend(int(b) for b in blocks[::-1])

    @staticmethod
    def slots(table: np.ndarray, start: int, stop: int) -> np.ndarray:
        """The arena slots of a row's positions start..stop-1, through its block table."""
        positions = np.arange(start, stop)
        return table[positions // BLOCK] * BLOCK + positions % BLOCK

    def gather(self, tables: list[np.ndarray], lengths: list[int]) -> tuple[list[np.ndarray], np.ndarray]:
        """The past tensors of a batch (one per past input, [batch, kv_heads, width, head_size]) and its mask
        over them, [batch, width] int64: row i holds its `lengths[i]` tokens, then a masked hole."""
        width = max(lengths, default=0)
        index = np.zeros((len(tables), width), dtype=np.int64)  # holes read slot 0: masked
        for i, (table, n) in enumerate(zip(tables, lengths, strict=True)):
            index[i, :n] = self.slots(table, 0, n)
        c = self.cache
        past = np.empty((2 * c.layers, len(tables), c.kv_heads, width, c.head_size), dtype=self.arena.dtype)
        for j in range(2 * c.layers):
            for h in range(c.kv_heads):
                np.take(self.arena[j, h], index, axis=0, out=past[j, :, h])
        mask = (np.arange(width)[None, :] < np.asarray(lengths, dtype=np.int64)[:, None]).astype(np.int64)
        return list(past), mask

    def write(self, table: np.ndarray, start: int, values: np.ndarray) -> None:
        """Store one row's new tokens: `values` [2L, kv_heads, tokens, head_size] at positions start.. of its table,
        a block at a time (a slice of the arena each: 2.5x faster than one fancy-indexed write of the slots for
        128 tokens of the 135M bench model)."""
        stop = start + values.shape[2]
        blocks = self._by_block()
        for b in range(start // BLOCK, self.blocks_for(stop)):
            lo, hi = max(start, b * BLOCK), min(stop, (b + 1) * BLOCK)
            blocks[:, :, table[b], lo - b * BLOCK : hi - b * BLOCK] = values[:, :, lo - start : hi - start]

    def _by_block(self) -> np.ndarray:
        """The arena as [2L, kv_heads, blocks, BLOCK, head_size]: a view, for copies a block at a time."""
        return self.arena.reshape(*self.arena.shape[:2], self.blocks, BLOCK, self.arena.shape[3])

    def read(self, table: np.ndarray, tokens: int, out: np.ndarray) -> None:
        """Copy a row's first `tokens` tokens into `out` [2L, kv_heads, >= tokens, head_size], a block at a time
        (the running batch's row: batch_cache.py)."""
        blocks = self._by_block()
        for b in range(self.blocks_for(tokens)):
            n = min(tokens, (b + 1) * BLOCK) - b * BLOCK
            out[:, :, b * BLOCK : b * BLOCK + n] = blocks[:, :, table[b], :n]
