"""One generation request inside the engine: its `Job` (what a protocol asks for: prompt ids, most new
tokens, sampling, stop strings), and the `Sequence` generating it (cache blocks, tokens and text so far),
which ends with a `FinishReason`.

The engine thread advances it; the request's handler reads what it made through `events` (an asyncio
queue filled on the event loop after each step) and cancels it by `cancel()` when its client is gone:
the engine drops a cancelled sequence, and frees its blocks, at the start of its next step.
"""

from __future__ import annotations

import asyncio
import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from pipeline.serve.generation.detokenizer import Detokenizer
from pipeline.serve.generation.sampler import Sampler, Sampling

if TYPE_CHECKING:
    from tokenizers import Tokenizer


class FinishReason(enum.StrEnum):
    """Why a sequence ended: OpenAI's two, which the answers send as `finish_reason` (a `str`, so the JSON is the
    value), and the three the handlers turn into a refusal or an error event instead."""

    STOP = "stop"  # an EOS id, or a stop string
    LENGTH = "length"  # max_tokens, or the context, reached
    CANCELLED = "cancelled"  # the client left
    TIMEOUT = "timeout"  # it waited longer than --timeout for a place
    ERROR = "error"  # a step raised: a server fault


@dataclass(frozen=True)
class Job:
    """What a protocol asks the engine for (not the HTTP request that carried it)."""

    prompt: list[int]  # token ids, special tokens included
    max_tokens: int  # new tokens at most (already within the context length)
    sampling: Sampling = field(default_factory=Sampling)
    stop: tuple[str, ...] = ()  # text that ends the answer (not included in it)


@dataclass
class Event:
    """What one step gave a sequence: new text (possibly ''), and why it finished, if it did."""

    text: str
    tokens: int  # tokens generated so far
    finish: FinishReason | None = None


class Sequence:
    """A job being generated."""

    def __init__(self, job: Job, tokenizer: Tokenizer, loop: asyncio.AbstractEventLoop | None) -> None:
        self.job = job
        self.tokens: list[int] = list(job.prompt)  # prompt, then each token chosen
        self.stored = 0  # tokens whose keys and values are in the pool
        self.blocks = np.zeros(0, dtype=np.int64)  # its block table (kv_pool.py), empty until admitted
        self.sampler = Sampler(job.sampling)
        self.detokenizer = Detokenizer(tokenizer, job.prompt)
        self.text = ""  # the answer so far, held-back text included
        self.sent = 0  # characters of `text` handed out in events
        self.finish: FinishReason | None = None
        self.cancelled = False
        self.events: asyncio.Queue[Event] | None = asyncio.Queue() if loop is not None else None
        self.submitted = time.perf_counter()
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None

    @property
    def generated(self) -> int:
        return len(self.tokens) - len(self.job.prompt)

    @property
    def prefilling(self) -> bool:
        """Part of the prompt is not in the pool yet."""
        return self.stored < len(self.job.prompt)

    def cancel(self) -> None:
        self.cancelled = True

    def take(self, token: int, eos_ids: frozenset[int]) -> Event:
        """A token chosen: the text it adds, stop strings and the limits checked; the event to hand out."""
        self.tokens.append(token)
        if token in eos_ids:
            self.finish = FinishReason.STOP
            self.text += self.detokenizer.flush()
        else:
            self.text += self.detokenizer.add(token)
            if self.generated >= self.job.max_tokens:
                self.finish = FinishReason.LENGTH
                self.text += self.detokenizer.flush()
        stops = self.job.stop
        hold = 0
        if stops:
            start = max(0, self.sent - max(map(len, stops)))
            found = [i for s in stops if (i := self.text.find(s, start)) >= 0]
            if found:  # the answer ends before the first stop string
                self.text, self.finish = self.text[: min(found)], FinishReason.STOP
            elif self.finish is None:  # text that may begin a stop string waits for the next token
                hold = max(map(len, stops)) - 1
        end = len(self.text) if self.finish else max(self.sent, len(self.text) - hold)
        new, self.sent = self.text[self.sent : end], end
        return Event(new, self.generated, self.finish)
