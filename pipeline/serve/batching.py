"""Dynamic batching: requests for one model that arrive together run as one onnxruntime call.

While a batch computes, new requests queue; the next batch takes everything queued (up to
`max_batch_size` rows), waiting at most `max_queue_delay_ms` for more. For a model whose runs take a
millisecond or more, and when the last batch held several requests (a lone client gains nothing
from waiting), the batcher also keeps filling while requests are still streaming in (none for
0.3 ms ends it), for at most half a run's time: clients answered together come back together,
and without this their requests would be split into several small batches. Requests of different
sizes are concatenated along dim 0 and the outputs split back by each request's row count; token rows of
different lengths (a text model's requests) are padded to the batch's longest row first, with each token
input's recorded padding value, when the model allows it (`ModelSession.padding`). The queue is
bounded: a full queue is a 503 with Retry-After, not unbounded memory. onnxruntime releases the
GIL, so batches run in a thread pool while the event loop keeps parsing requests. Even runs of
0.05 ms go there: running them on the event loop instead was measured no cheaper per CPU-second
(bench/bench_serve.py, small MLP, c=1 to 32), and on a shared core a server with one runnable
thread gets a smaller share of it than one with two (0.55-0.6x the requests/s).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from pipeline.serve.errors import RequestError, Unavailable
from pipeline.serve.metrics import ModelStats
from pipeline.serve.session import ORT_ERRORS
from pipeline.serve.timing import current_request

log = logging.getLogger("pipe.serve")

Feeds = dict[str, np.ndarray]
RunFn = Callable[[Feeds], Feeds]
T = TypeVar("T")


@dataclass(frozen=True)
class BatchSettings:
    """Per-model batching and queueing limits."""

    max_batch_size: int = 64  # rows per onnxruntime call; a larger single request is refused
    max_queue_delay_ms: float = 0.0  # how long a batch may wait for more requests; 0: take what is queued
    max_queue: int = 256  # requests waiting per model; more are refused with 503 + Retry-After
    timeout_s: float = 30.0  # per request, queue + compute; past it the request gets a 503
    instances: int = 1  # batches of one model that may compute at the same time


# Adaptive filling (see the module docstring): only for runs slower than this ...
ADAPTIVE_MIN_RUN_S = 1e-3
# ... and it stops at the first lull this long, or after this share of a run's time.
ADAPTIVE_LULL_S = 3e-4
ADAPTIVE_SHARE = 0.5


@dataclass(eq=False)
class _Pending:
    feeds: Feeds
    rows: int
    key: tuple  # inputs' names, dtypes and non-batch dims: only equal keys can be concatenated
    future: asyncio.Future[Feeds]
    enqueued: float = field(default_factory=time.perf_counter)
    queue_s: float | None = None  # set when its batch starts
    compute_s: float | None = None  # its batch's run time


def _batch_key(feeds: Feeds, padded: dict[str, int] | None = None) -> tuple:
    """What requests batched together share: inputs' names, dtypes and non-batch dims (a padded token
    input's sequence length aside)."""
    if padded:
        return tuple((n, a.dtype, a.shape[1:-1] if n in padded else a.shape[1:]) for n, a in sorted(feeds.items()))
    if len(feeds) == 1:  # the usual request: no sort, no generator (1 us -> 0.2 us)
        ((name, a),) = feeds.items()
        return ((name, a.dtype, a.shape[1:]),)
    return tuple((name, a.dtype, a.shape[1:]) for name, a in sorted(feeds.items()))


def _concatenate(parts: list[np.ndarray], pad: int | None) -> np.ndarray:
    """Requests' rows of one input as one batch; token rows ([rows, length]) padded on the right to the
    longest with `pad` when their lengths differ."""
    longest = max(p.shape[-1] for p in parts) if pad is not None else None
    if longest is None or all(p.shape[-1] == longest for p in parts):
        return np.concatenate(parts)
    widths = [[(0, 0)] * (p.ndim - 1) + [(0, longest - p.shape[-1])] for p in parts]
    return np.concatenate([np.pad(p, w, constant_values=pad) for p, w in zip(parts, widths, strict=True)])


class Batcher:
    """Queue and batch requests for one loaded model version."""

    def __init__(
        self,
        run: RunFn,
        batchable: bool,
        settings: BatchSettings,
        executor: Executor,
        stats: ModelStats,
        padding: dict[str, int] | None = None,
    ) -> None:
        self._run = run
        self._padding = padding  # token input -> its padding value: rows of different lengths batch together
        self._batchable = batchable
        self.settings = settings
        self._executor = executor
        self._stats = stats
        self._items: collections.deque[_Pending] = collections.deque()
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(settings.instances)
        self._running: set[asyncio.Task] = set()
        self._forming: list[_Pending] = []  # taken from the queue, waiting for more before it runs
        self._preparing = 0  # requests decoding their pictures: in the queue's count, not yet in it
        self._closing = False
        self._run_s = 0.0  # moving average of one onnxruntime run's time, for adaptive filling
        self._last_requests = 0  # requests in the previous batch: more than one means concurrent clients
        self._loop_task = asyncio.get_running_loop().create_task(self._loop())

    def check_rows(self, rows: int) -> None:
        """Refuse a request of more rows than one batch takes (also asked before pictures are decoded)."""
        if self._batchable and rows > self.settings.max_batch_size:
            raise RequestError(
                f"the request holds {rows} rows, more than this model's max batch size "
                f"{self.settings.max_batch_size}; split it into smaller requests"
            )

    def _admit(self) -> None:
        if len(self._items) + self._preparing >= self.settings.max_queue:
            raise Unavailable(f"the queue for this model is full ({self.settings.max_queue} requests); retry shortly")

    @contextlib.contextmanager
    def preparing(self) -> Iterator[None]:
        """A request's place in this model's queue while it prepares (its pictures decode): counted
        against `max_queue` like a queued request, so decoding cannot bypass the bound."""
        self._admit()
        self._preparing += 1
        try:
            yield
        finally:
            self._preparing -= 1

    async def prepare(self, work: Callable[[], T], arrived: float, inference_pool: bool = True) -> T:
        """Run a request's preparation (its texts tokenized, a large body decoded) in a worker thread, off the
        event loop: counted against `max_queue` while it runs (`preparing`), and within the request's
        `timeout_s` from `arrived` (past it, a 503; the work itself finishes in its thread). In the inference
        pool by default (tokenizing is part of the model's work); `inference_pool=False`: asyncio's default
        pool, for work that must not hold back batches already queued (decoding bodies)."""
        with self.preparing():
            left = self.time_left(arrived)
            pool = self._executor if inference_pool else None
            future = asyncio.get_running_loop().run_in_executor(pool, work)
            try:
                return await asyncio.wait_for(future, left)
            except TimeoutError:
                self._expire(None)
                raise  # not reached: _expire raised the 503

    def time_left(self, arrived: float) -> float:
        """Seconds left of the request's `timeout_s` (loop time `arrived`); past it, a 503."""
        left = self.settings.timeout_s - (asyncio.get_running_loop().time() - arrived)
        if left <= 0:
            self._expire(None)
        return left

    async def infer(self, feeds: Feeds, rows: int, arrived: float | None = None) -> Feeds:
        """Queue one request (already checked against the model) and wait for its outputs, within
        `timeout_s` from `arrived` (the loop time the request's inference began; default now)."""
        if self._closing:
            raise Unavailable("this model version is being unloaded; retry to reach the one that replaces it")
        self.check_rows(rows)
        self._admit()
        left = self.settings.timeout_s if arrived is None else self.time_left(arrived)
        pending = _Pending(feeds, rows, _batch_key(feeds, self._padding), asyncio.get_running_loop().create_future())
        self._items.append(pending)
        self._wake.set()
        self._stats.queued(1)
        # One timer per request (cheaper than wait_for's extra task); on expiry the future fails,
        # a batch not yet formed skips it, and a running batch drops its result.
        timer = asyncio.get_running_loop().call_later(left, self._expire, pending.future)
        try:
            return await pending.future
        finally:
            timer.cancel()
            self._stats.queued(-1)
            if (record := current_request.get()) is not None:  # the access log's record of this request
                record.rows, record.queue_s, record.compute_s = rows, pending.queue_s, pending.compute_s

    def _expire(self, future: asyncio.Future[Feeds] | None) -> None:
        """Fail `future` with the timeout's 503 (raise it, when there is no future yet)."""
        late = Unavailable(
            f"the request did not finish within the {self.settings.timeout_s:g}s timeout; the server is overloaded"
        )
        if future is None:
            raise late
        if not future.done():
            future.set_exception(late)

    async def close(self) -> None:
        """Finish every queued and running request, then stop."""
        self._closing = True
        self._wake.set()  # a batch still filling runs now: nothing more will join it
        while self._items or self._forming or self._running:
            await asyncio.sleep(0.01)
        # The loop returns by itself: cancelled, its task would keep the CancelledError, whose
        # traceback holds the loop's frame and so this batcher and its session in a reference cycle.
        await self._loop_task

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        delay = self.settings.max_queue_delay_ms / 1000
        while True:
            await self._slots.acquire()
            while not self._items:
                if self._closing:
                    self._slots.release()
                    return
                self._wake.clear()
                await self._wake.wait()
            batch = self._forming = self._take()
            adaptive = self._run_s >= ADAPTIVE_MIN_RUN_S and max(len(batch), self._last_requests) > 1
            window = max(delay, ADAPTIVE_SHARE * self._run_s if adaptive else 0.0)
            if self._batchable and window > 0 and self._room(batch) > 0:
                deadline = loop.time() + window
                while self._room(batch) > 0 and not self._closing and (remaining := deadline - loop.time()) > 0:
                    self._wake.clear()
                    lull = remaining if delay >= window else min(remaining, ADAPTIVE_LULL_S)
                    try:
                        await asyncio.wait_for(self._wake.wait(), lull)
                    except TimeoutError:
                        if lull < remaining:
                            break  # requests stopped arriving: run what we have
                    batch += self._take(batch)
            self._forming = []
            if not batch:
                self._slots.release()
                continue
            self._last_requests = len(batch)
            task = loop.create_task(self._dispatch(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    def _room(self, batch: list[_Pending]) -> int:
        return self.settings.max_batch_size - sum(p.rows for p in batch)

    def _take(self, batch: list[_Pending] | None = None) -> list[_Pending]:
        """Move queued requests that fit the batch (same key, rows left) out of the queue."""
        taken: list[_Pending] = []
        kept: collections.deque[_Pending] = collections.deque()
        current = list(batch or [])
        while self._items:
            item = self._items.popleft()
            if item.future.done():  # timed out while queued
                continue
            if not current and not taken:
                taken.append(item)
                if not self._batchable:
                    break
                continue
            head = (current or taken)[0]
            fits = item.rows <= self._room(current + taken)
            if self._batchable and item.key == head.key and fits:
                taken.append(item)
            else:
                kept.append(item)
        kept.extend(self._items)
        self._items = kept
        return taken

    async def _dispatch(self, batch: list[_Pending]) -> None:
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        try:
            results, compute = await loop.run_in_executor(self._executor, self._timed, batch)
        except Exception as exc:  # not onnxruntime refusing data: a server fault every request must hear of
            log.exception("a batch of %d request(s) failed", len(batch))
            results, compute = [exc] * len(batch), time.perf_counter() - started
        finally:
            self._slots.release()
        self._run_s = compute if not self._run_s else 0.8 * self._run_s + 0.2 * compute
        self._stats.executed(sum(p.rows for p in batch), compute)
        for pending, result in zip(batch, results, strict=True):
            queue_s = pending.queue_s = started - pending.enqueued
            pending.compute_s = compute
            answered = not pending.future.done() and not isinstance(result, Exception)
            self._stats.ran(pending.rows, queue_s, compute if answered else None)
            if pending.future.done():
                continue
            if isinstance(result, Exception):
                pending.future.set_exception(result)
            else:
                pending.future.set_result(result)

    def _timed(self, batch: list[_Pending]) -> tuple[list[Feeds | Exception], float]:
        """`_execute` and its time, measured in the worker thread: timed from the event loop, a run
        would also count the hand-off and the wait for the loop to notice its end (0.5 ms recorded
        for a 0.05 ms run under load), inflating compute times and the adaptive filling window."""
        started = time.perf_counter()
        results = self._execute(batch)
        return results, time.perf_counter() - started

    def _execute(self, batch: list[_Pending]) -> list[Feeds | Exception]:
        """Run in a worker thread: concatenate, run once, split back by rows."""
        if len(batch) == 1:
            return [self._run_one(batch[0].feeds)]
        pad = self._padding or {}
        feeds = {name: _concatenate([p.feeds[name] for p in batch], pad.get(name)) for name in batch[0].feeds}
        try:
            merged = self._run(feeds)
        except ORT_ERRORS:  # one bad request must not fail its batch-mates: rerun each alone
            return [self._run_one(p.feeds) for p in batch]
        bounds = np.cumsum([p.rows for p in batch])[:-1]
        split = {name: np.split(array, bounds) for name, array in merged.items()}
        return [{name: parts[i] for name, parts in split.items()} for i in range(len(batch))]

    def _run_one(self, feeds: Feeds) -> Feeds | Exception:
        try:
            return self._run(feeds)
        except ORT_ERRORS as exc:  # onnxruntime refused the data (e.g. an index out of range)
            log.info("model rejected a request: %s", exc)
            return RequestError(f"the model could not run on this input: {exc}")
