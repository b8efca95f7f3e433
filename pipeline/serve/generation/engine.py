"""The generation engine of one model version: requests in, tokens and text out as they are made.

`check` fits a request to the context length and the pool; `submit` queues its `Job` (a full queue is a
503 with Retry-After) and returns its `Sequence`; one that waits longer than `wait_s` for a place ends
`timeout` (a 503 too). One task in the server's compute pool steps while there is work (`_steps`), off
the event loop: each step (`scheduler.py`: admit, a prefill chunk, one decode call for every running
row) follows the last at once, and its events go to the event loop, which puts them on each sequence's
queue and writes the metrics (time to first token, time per output token, token counts, running and
waiting sequences, pool use). New requests join between steps; a cancelled one is dropped at the next.
A step that raises ends every sequence `error` (`Scheduler.abort_all`), and the engine serves on.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING

import numpy as np

from pipeline.artifact.generation import Generation
from pipeline.serve.errors import RequestError, Unavailable
from pipeline.serve.generation.features import GraphFeatures
from pipeline.serve.generation.kv_pool import KVPool
from pipeline.serve.generation.scheduler import Feeds, Scheduler, StepReport
from pipeline.serve.generation.sequence import Event, FinishReason, Job, Sequence
from pipeline.serve.generation.settings import GenerationSettings
from pipeline.serve.generation.stats import GenerationStats

if TYPE_CHECKING:
    from onnxruntime import InferenceSession, IOBinding
    from tokenizers import Tokenizer

log = logging.getLogger("pipe.serve")


class Engine:
    """Continuous batching over one onnxruntime session of a decoder graph."""

    def __init__(
        self,
        session: InferenceSession,
        generation: Generation,
        tokenizer: Tokenizer,
        settings: GenerationSettings,
        executor: Executor | None,
        stats: GenerationStats | None = None,  # None: no metrics (tests)
    ) -> None:
        self.generation = generation
        self.tokenizer = tokenizer
        self.settings = settings
        self.context_length = generation.context_length
        self._session = session
        self._outputs = ["logits", *generation.cache.present_names()]
        self.pool = KVPool(generation.cache, int(settings.kv_cache_mb * 1024 * 1024))
        graph = GraphFeatures.of(session, tokenizer)
        self._vocab = graph.vocab
        self._in_place = dict(zip(generation.cache.past_names(), generation.cache.present_names(), strict=True))
        # a decode in place's IOBinding, the batch array's views bound, and its logits (`_run_in_place`)
        self._binding: tuple[IOBinding, np.ndarray] | tuple[None, None] = (None, None)
        self._bound_at: tuple[int, tuple[int, ...]] | None = None
        self.scheduler = Scheduler(
            pool=self.pool,
            settings=settings,
            graph=graph,
            eos_ids=generation.eos_token_ids,
            run=self._run,
            run_in_place=self._run_in_place,
        )
        self._executor = executor
        self._stats = stats
        self._lock = threading.Lock()  # guards `_incoming` and `_stepping`, shared with the step thread
        self._incoming: list[Sequence] = []  # submitted since the last step
        self._stepping = False  # `_steps` runs (started by the request that found it stopped)
        self._loop: asyncio.AbstractEventLoop | None = None  # the event loop of the latest request
        self._closed = False

    def describe(self) -> str:
        """One line for the load log: the pool and the batch."""
        pool = self.pool
        s = self.scheduler
        return (f"KV cache pool of {pool.capacity_tokens} tokens ({pool.arena.nbytes / 2**20:.0f} MB), up to "
                f"{self.settings.max_sequences} sequences a step, prompts prefilled {s.prefill_chunk} tokens a step "
                f"({s.burst_chunk} when more join than run), context {self.context_length}")  # fmt: skip

    def _run(self, feeds: Feeds) -> list[np.ndarray]:
        return self._session.run(self._outputs, feeds)

    def _run_in_place(self, feeds: Feeds, keep: bool) -> np.ndarray:
        """A call of a written decoder whose `decode_in_place` is a constant True (pipe serve's session of one:
        serve/session.py): each past tensor (a view of the running batch's array, or of a prefill's scratch) is
        bound as its present too, so the new keys and values are written into it; the logits. With `keep` (a
        decode) the views stay bound while the array and its rows do (binding 60 of them anew took about a
        millisecond a step on the 135M bench model); the tokens, mask and positions are bound each call."""
        from onnxruntime import OrtValue

        first = feeds[next(iter(self._in_place))]
        where = (first.__array_interface__["data"][0], first.shape)  # the views' memory: the array's, its rows
        binding, logits = self._binding if keep and self._bound_at == where else (None, None)
        if binding is None or logits is None:
            binding = self._session.io_binding()
            for name, present in self._in_place.items():
                bound = OrtValue.ortvalue_from_numpy(feeds[name])  # the array's own memory, not a copy
                binding.bind_ortvalue_input(name, bound)
                binding.bind_ortvalue_output(present, bound)
            # the logits of one column a row (a decode's token, a prefill's last: `logits_from` -1) into an array
            # of ours, read without get_outputs(), which wraps all 61 outputs (0.3 ms a step)
            logits = np.empty((first.shape[0], 1, self._vocab), dtype=np.float32)
            binding.bind_ortvalue_output("logits", OrtValue.ortvalue_from_numpy(logits))
            if keep:
                self._binding, self._bound_at = (binding, logits), where
        for name, value in feeds.items():
            if name not in self._in_place:  # (an input with a default binds only as an OrtValue)
                binding.bind_ortvalue_input(name, OrtValue.ortvalue_from_numpy(value))
        self._session.run_with_iobinding(binding)
        return logits

    def check(self, prompt_tokens: int, max_tokens: int | None) -> int:
        """The new tokens a request may have (its max_tokens, else what the context leaves); 400 when its
        prompt leaves no room, or when it could never fit the pool."""
        context = self.context_length
        if prompt_tokens == 0:
            raise RequestError("the prompt is empty (0 tokens); send some text")
        if context is not None and prompt_tokens >= context:
            raise RequestError(
                f"the prompt is {prompt_tokens} tokens, and this model's context length is {context} (prompt and "
                "new tokens together); shorten the prompt"
            )
        room = context - prompt_tokens if context is not None else None
        wanted = max_tokens if max_tokens is not None else room
        if wanted is None:
            raise RequestError("this model records no context length: send max_tokens")
        if room is not None and wanted > room:
            wanted = room  # the context caps it; the answer ends with finish_reason "length"
        needed = prompt_tokens + wanted
        if needed > self.pool.capacity_tokens:
            raise RequestError(
                f"the prompt and max_tokens need {needed} tokens of KV cache, and the server's pool holds "
                f"{self.pool.capacity_tokens}; ask for fewer tokens, or start pipe serve with a larger --kv-cache-mb"
            )
        return wanted

    def submit(self, job: Job) -> Sequence:
        """Queue a checked job; 503 with Retry-After when the waiting queue is full or the engine stopped."""
        if self._closed:
            raise Unavailable("the model is being unloaded; retry")
        waiting = len(self.scheduler.waiting) + len(self._incoming)
        if waiting >= self.settings.max_waiting:
            raise Unavailable(
                f"{waiting} requests are already waiting for this model (--max-waiting "
                f"{self.settings.max_waiting}); retry after a moment"
            )
        loop = asyncio.get_running_loop()
        seq = Sequence(job, self.tokenizer, loop)
        with self._lock:
            self._incoming.append(seq)
            self._loop = loop  # where the step thread hands events out (one loop in a server; a test's in turn)
            start, self._stepping = not self._stepping, True
        if start:
            try:
                loop.run_in_executor(self._executor, self._steps)
            except RuntimeError:  # the compute pool was shut down: the server is stopping
                with self._lock:
                    self._incoming.remove(seq)
                    self._stepping = False
                raise Unavailable("the server is shutting down; retry") from None
        self._report()
        return seq

    def _steps(self) -> None:
        """Steps one after another while there is work, in one of the compute pool's threads (which it holds until
        then); each step's events are handed to the event loop, which never gates the next step: starting every
        step from the event loop left the step thread idle 0.5 ms (one stream) to 0.9 ms (16 streams) between
        steps, the p50 on the 135M bench model, two thread wake-ups on cores onnxruntime keeps busy. New
        requests join between steps, taken from `_incoming` under the lock; this thread owns the scheduler."""
        s = self.scheduler
        while True:
            with self._lock:
                s.waiting.extend(self._incoming)
                self._incoming.clear()
                if not s.busy:
                    self._stepping = False
                    return
            started = time.perf_counter()
            try:
                report = s.step()
            except Exception:  # a server fault: every sequence ends with it, the engine stays up
                log.exception("generation step failed")
                self._post(self._tell_failed, self._failed())
                continue
            now = time.perf_counter()
            self._post(self._hand_out, report, now, now - started)

    def _post(self, call: Callable[..., None], *args: object) -> None:
        """`call(*args)` on the event loop of the latest request, from the step thread; dropped when that loop
        has closed (its requests' readers are gone with it: a server shutting down)."""
        with self._lock:
            loop = self._loop
        assert loop is not None  # set by the request that started the step thread
        try:
            loop.call_soon_threadsafe(call, *args)
        except RuntimeError:
            pass

    def _hand_out(self, report: StepReport, now: float, took: float) -> None:
        """A step's events to their sequences' queues, and its metrics (`now`: when it returned)."""
        for seq, event in report.events:
            if seq.first_token_at is None and event.tokens > 0:
                seq.first_token_at = now
                self._observe("first_token", now - seq.submitted)
            elif event.tokens > 0 and seq.last_token_at is not None and event.finish != FinishReason.CANCELLED:
                self._observe("per_token", now - seq.last_token_at)
            seq.last_token_at = now
            if seq.events is not None:
                seq.events.put_nowait(event)
            if event.finish not in (None, FinishReason.TIMEOUT) and self._stats is not None:
                self._stats.finished(len(seq.job.prompt), seq.generated)
        if self._stats is not None:
            self._stats.stepped(report.decoded, report.prefilled, took)
        self._report()

    def _failed(self) -> list[tuple[Sequence, Event]]:
        """After a step raised, in the step thread: every sequence, the submitted too, ends `error`, its blocks
        freed (`Scheduler.abort_all`); the events telling them."""
        with self._lock:
            self.scheduler.waiting.extend(self._incoming)
            self._incoming.clear()
        self._binding, self._bound_at = (None, None), None  # bound afresh at the next decode
        return self.scheduler.abort_all(FinishReason.ERROR)

    def _tell_failed(self, events: list[tuple[Sequence, Event]]) -> None:
        for seq, event in events:
            if seq.events is not None:
                seq.events.put_nowait(event)
        self._report()

    def _observe(self, what: str, seconds: float) -> None:
        if self._stats is not None:
            self._stats.observe(what, seconds)

    def _report(self) -> None:
        if self._stats is not None:
            s = self.scheduler
            self._stats.gauges(
                len(s.running) + len(s.prefilling), len(s.waiting) + len(self._incoming), self.pool.usage
            )

    async def close(self) -> None:
        """Refuse new requests, let the sequences accepted finish, then stop the loop."""
        self._closed = True
        while self._stepping:
            await asyncio.sleep(0.01)
