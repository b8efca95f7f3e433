"""The generation engine of one model version: requests in, tokens and text out as they are made.

`submit` checks the request against the context length and the pool, queues it (a full queue is a
503 with Retry-After) and returns its `Sequence`; one that waits longer than `wait_s` for a place ends
`timeout` (a 503 too). One task per engine loops while there is work:
each step (`scheduler.py`: admit, a prefill chunk, one decode call for every running row) runs in the
server's compute pool, off the event loop; its events are then put on each sequence's queue, and the
metrics (time to first token, time per output token, token counts, running and waiting sequences,
pool use) are written. New requests join between steps; a cancelled one is dropped at the next.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Executor
from typing import Any

import numpy as np

from pipeline.artifact.generation import DECODE_IN_PLACE, LOGITS_FROM, PRESENT_NEW_ONLY, Generation
from pipeline.runtime.session import constants_of
from pipeline.serve.errors import RequestError, Unavailable
from pipeline.serve.generation.kv_pool import KVPool
from pipeline.serve.generation.scheduler import Feeds, Scheduler, burst_budget
from pipeline.serve.generation.sequence import TIMEOUT, Request, Sequence
from pipeline.serve.generation.settings import GenerationSettings

log = logging.getLogger("pipe.serve")


class Engine:
    """Continuous batching over one onnxruntime session of a decoder graph."""

    def __init__(
        self,
        session: Any,  # onnxruntime.InferenceSession
        generation: Generation,
        tokenizer: Any,
        settings: GenerationSettings,
        executor: Executor | None,
        stats: Any = None,  # GenerationStats, or None (tests)
    ) -> None:
        self.generation = generation
        self.tokenizer = tokenizer
        self.settings = settings
        self.context_length = generation.context_length
        self._session = session
        self._outputs = ["logits", *generation.cache.present_names()]
        self.pool = KVPool(generation.cache, int(settings.kv_cache_mb * 1024 * 1024))
        optional = _optional_inputs(session)
        last_logits = LOGITS_FROM in optional
        self._vocab = _vocab(session, tokenizer)
        burst = burst_budget(settings.prefill_chunk, 0 if last_logits else self._vocab)
        self._in_place = dict(zip(generation.cache.past_names(), generation.cache.present_names(), strict=True))
        self._binding: Any = (None, None)  # a decode in place's IOBinding, the batch array's views bound, and its
        # logits (`_run_in_place`)
        self._bound_at: tuple[int, tuple[int, ...]] | None = None
        self.scheduler = Scheduler(
            self._run, generation.cache, self.pool, generation.eos_token_ids, settings.max_sequences,
            settings.prefill_chunk, settings.wait_s, burst, last_logits, PRESENT_NEW_ONLY in optional,
            self._run_in_place if DECODE_IN_PLACE in constants_of(session) else None,
        )  # fmt: skip
        self._executor = executor
        self._stats = stats
        self._incoming: list[Sequence] = []  # submitted since the last step (the step thread never sees this list)
        self._task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
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

    def submit(self, request: Request) -> Sequence:
        """Queue a checked request; 503 with Retry-After when the waiting queue is full or the engine stopped."""
        if self._closed:
            raise Unavailable("the model is being unloaded; retry")
        waiting = len(self.scheduler.waiting) + len(self._incoming)
        if waiting >= self.settings.max_waiting:
            raise Unavailable(
                f"{waiting} requests are already waiting for this model (--max-waiting "
                f"{self.settings.max_waiting}); retry after a moment"
            )
        loop = asyncio.get_running_loop()
        seq = Sequence(request, self.tokenizer, loop)
        self._incoming.append(seq)
        if self._task is None or self._task.done():  # the first request, or a new event loop (tests)
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._loop())
        assert self._wake is not None
        self._wake.set()
        self._report()
        return seq

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._wake is not None
        while True:
            # New requests join between steps, here on the event loop: the step thread owns the scheduler's lists.
            self.scheduler.waiting.extend(self._incoming)
            self._incoming.clear()
            if not self.scheduler.busy:
                self._wake.clear()
                await self._wake.wait()
                continue
            started = time.perf_counter()
            try:
                report = await loop.run_in_executor(self._executor, self.scheduler.step)
            except Exception:  # a server fault: every sequence ends with it, the engine stays up
                log.exception("generation step failed")
                self._fail_all()
                continue
            now = time.perf_counter()
            for seq, event in report.events:
                if seq.first_token_at is None and event.tokens > 0:
                    seq.first_token_at = now
                    self._observe("first_token", now - seq.submitted)
                elif event.tokens > 0 and seq.last_token_at is not None and event.finish != "cancelled":
                    self._observe("per_token", now - seq.last_token_at)
                seq.last_token_at = now
                if seq.events is not None:
                    seq.events.put_nowait(event)
                if event.finish not in (None, TIMEOUT) and self._stats is not None:
                    self._stats.finished(len(seq.request.prompt), seq.generated)
            if self._stats is not None:
                self._stats.stepped(report.decoded, report.prefilled, now - started)
            self._report()

    def _fail_all(self) -> None:
        from pipeline.serve.generation.sequence import Event

        s = self.scheduler
        for seq in [*s.running, *s.prefilling, *s.waiting, *self._incoming]:
            seq.finish = "error"
            if seq.blocks.size:
                self.pool.release(seq.blocks)
                seq.blocks = np.zeros(0, dtype=np.int64)
            if seq.events is not None:
                seq.events.put_nowait(Event("", seq.generated, "error"))
        s.running, s.prefilling = [], []
        s.batch.clear()
        self._binding, self._bound_at = (None, None), None  # bound afresh at the next decode
        s.waiting.clear()
        self._incoming.clear()

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
        while (self.scheduler.busy or self._incoming) and self._task is not None and not self._task.done():
            await asyncio.sleep(0.01)
        if self._task is not None:
            self._task.cancel()


def _vocab(session: Any, tokenizer: Any) -> int:
    """The logits' last dimension as the graph declares it, else the tokenizer's vocabulary."""
    shape = next((o.shape for o in session.get_outputs() if o.name == "logits"), None)
    if shape and isinstance(shape[-1], int):
        return shape[-1]
    return int(tokenizer.get_vocab_size())


def _optional_inputs(session: Any) -> set[str]:
    """The graph's inputs with a default (a written decoder's `logits_from`, `present_new_only` and
    `decode_in_place`: pipeline/export/fused_decoder.py)."""
    overridable = getattr(session, "get_overridable_initializers", lambda: [])()
    return {i.name for i in overridable}
