"""The running rows' KV cache: one array the decode calls read where it lies and append each new token to.

`data` is [2 x layers, rows, kv_heads, width, head_size]: row i holds its sequence's `stored` tokens in
columns 0.. and a hole after them (masked; zeros or an earlier row's finite values, never NaN, so a masked
column weighs exactly 0). The past tensors of a decode call are `data[j, :batch]`, views of the array, not
copies (a leading-axis slice of a C-ordered array is contiguous, and onnxruntime reads a contiguous numpy
array in place), and the call's new keys and values go into the column after each row's last: a written
decoder with `decode_in_place` a constant True (pipe serve's session of one) writes them there itself,
its presents bound to those views (pipeline/export/fused_decoder.py); another graph's are copied in
(`append`: the presents' last column, or all of them where the graph takes `present_new_only`), so every
decoder runs this way.

What changes between steps changes in place: a row that ends takes the last row into its place (one row's
tokens copied), a row joining (its prompt prefilled) is read from the pool into the next free row
(`KVPool.read`). The array is made again (every row copied once) only when a row reaches its width
(GROW columns more than the longest row are then made), when the rows outnumber it (it doubles, up to
the server's --max-sequences), or when the width passes the longest row by more than max(2 x GROW, a
quarter of it) (holes of rows that ended, which attention would otherwise read every step).

The array lives in one of two flat buffers, and a remake copies it into the other: memory this process
has written before. Fresh memory costs a page fault per page on its first write, and on this machine
that made the first touch of a new array far slower than the copy itself: on the 135M bench model, 16
rows of 128-token prompts and 128 new tokens, the four remakes and the joiners' reads took 1.2-1.9 s of
a 13 s run in fresh arrays against 0.12 s in written ones. A buffer grows (to twice what is asked, so a
row's next few widths fit) and never shrinks: it keeps the largest batch the server ran, as
onnxruntime's own arena keeps its largest call. Between remakes the spare is a prefill's scratch
(`scratch`): a written decoder's prefill in place writes its rows' keys and values there before they go
to the pool (scheduler.py).

Before it, the graph concatenated each step's past and new keys and values into presents and those were
fed back: a copy of the whole cache in every step, the O(context) part of a step. On the 135M bench model,
16 rows at 192 positions, onnxruntime's profile gave 17-19 ms of an 80 ms step to those Concats; without
them the attention's reads of a cache that no copy just brought into the processor's caches take 5-6 ms
more, and the step is 6-9 ms faster (docs/language-models.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence as Rows

import numpy as np

from pipeline.artifact.generation import CacheLayout
from pipeline.serve.generation.kv_pool import BLOCK, KVPool
from pipeline.serve.generation.sequence import Sequence

GROW = 2 * BLOCK  # columns a full row's width grows by past the longest row


class BatchCache:
    """The keys and values of the sequences a decode call runs, in one array (module doc)."""

    def __init__(self, cache: CacheLayout, max_rows: int) -> None:
        self.cache = cache
        self.max_rows = max_rows
        self.rows: list[Sequence] = []
        # the array's storage and the spare a remake copies it into (module doc); they only grow
        self._buffers = [np.zeros(0, dtype=np.dtype(cache.dtype)) for _ in range(2)]
        self._spare = 0  # the buffer `data` is not in
        self.data = self._view(0, 0)
        self.remade = 0  # times the array was made again (tests, and the reason behind a slow step)
        self.allocated = 0  # times a buffer grew (tests: a batch the buffers held before costs no new memory)

    def _view(self, rows: int, width: int) -> np.ndarray:
        """An array of `rows` x `width` rows in the spare buffer, grown when too small (its holes hold zeros or
        earlier finite keys and values); the caller copies the rows into it and makes it `data`."""
        c = self.cache
        shape = (2 * c.layers, rows, c.kv_heads, width, c.head_size)
        size = math.prod(shape)
        if self._buffers[self._spare].size < size:
            self._buffers[self._spare] = np.zeros(2 * size, dtype=self._buffers[self._spare].dtype)
            self.allocated += 1
        return self._buffers[self._spare][:size].reshape(shape)

    def scratch(self, rows: int, width: int) -> np.ndarray:
        """[2 x layers, rows, kv_heads, width, head_size] in the spare buffer, for a prefill call in place
        (scheduler.py) to read its past from and write its new keys and values into, before the step's decode
        (which may remake the array into that buffer): prefills too write into memory written before."""
        return self._view(rows, width)

    def clear(self) -> None:
        """Nothing runs: no rows (the buffers stay, for the next batch)."""
        self.rows = []
        self.data = self.data[:, :0, :, :0]

    def hold(self, rows: Rows[Sequence], pool: KVPool) -> list[Sequence]:
        """Hold exactly `rows` (the running sequences; a joiner's prompt is in the pool): returns them in the
        array's row order, which the next decode call feeds."""
        wanted = {id(seq) for seq in rows}
        i = 0
        while i < len(self.rows):
            if id(self.rows[i]) in wanted:
                i += 1
                continue
            last = self.rows.pop()
            if i < len(self.rows):  # the last row takes the place of the one that ended
                self.data[:, i, :, : last.stored] = self.data[:, len(self.rows), :, : last.stored]
                self.rows[i] = last
        held = {id(seq) for seq in self.rows}
        joiners = [seq for seq in rows if id(seq) not in held]
        self._fit(len(self.rows) + len(joiners), max(seq.stored for seq in rows))
        for seq in joiners:
            pool.read(seq.blocks, seq.stored, self.data[:, len(self.rows)])
            self.rows.append(seq)
        return list(self.rows)

    def _fit(self, rows: int, longest: int) -> None:
        """Room for `rows` rows and for one more token after the `longest` row's (module doc)."""
        capacity, width = self.data.shape[1], self.data.shape[3]
        narrow = longest >= width
        wide = width > longest + 1 + max(2 * GROW, longest // 4)
        if rows <= capacity and not narrow and not wide:
            return
        if rows > capacity:
            capacity = min(self.max_rows, max(rows, 2 * capacity))
        if narrow or wide:
            width = longest + GROW
        data = self._view(capacity, width)
        kept = min(width, self.data.shape[3])
        data[:, : len(self.rows), :, :kept] = self.data[:, : len(self.rows), :, :kept]
        self.data, self._spare = data, 1 - self._spare
        self.remade += 1

    def past(self) -> tuple[list[np.ndarray], np.ndarray]:
        """The past tensors of the rows (views of the array) and their mask [rows, width]."""
        batch = len(self.rows)
        stored = np.array([seq.stored for seq in self.rows], dtype=np.int64)
        mask = (np.arange(self.data.shape[3])[None, :] < stored[:, None]).astype(np.int64)
        return [self.data[j, :batch] for j in range(self.data.shape[0])], mask

    def append(self, presents: list[np.ndarray]) -> None:
        """Write a decode call's new keys and values (each present's last column) after each row's last token;
        the caller then counts the token in each sequence's `stored`."""
        new = np.stack([p[:, :, -1] for p in presents], axis=1)  # [rows, 2L, kv_heads, head_size]
        columns = np.array([seq.stored for seq in self.rows], dtype=np.int64)
        self.data[:, np.arange(len(self.rows)), :, columns, :] = new
