"""The scheduler over a stand-in graph (no model: fast): `abort_all` ends every sequence and gives every block back,
and every finish reason a sequence can end with, so every one the server can send, is a `FinishReason`."""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import orjson

from pipeline.artifact.generation import CacheLayout
from pipeline.serve.generation import openai_api
from pipeline.serve.generation.features import GraphFeatures
from pipeline.serve.generation.kv_pool import KVPool
from pipeline.serve.generation.sampler import Sampling
from pipeline.serve.generation.scheduler import Feeds, Scheduler
from pipeline.serve.generation.sequence import Event, FinishReason, Job, Sequence
from pipeline.serve.generation.settings import GenerationSettings

CACHE = CacheLayout(layers=2, kv_heads=1, head_size=4)
VOCAB, EOS, NEXT = 8, 2, 5  # the stand-in graph always picks NEXT (greedy)
GENERATION = Path(__file__).parents[2] / "pipeline" / "serve" / "generation"


class Letters:
    """A tokenizer's `decode`: one letter a token."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + i) for i in ids)


def _run(feeds: Feeds) -> list[np.ndarray]:
    """A decoder graph without `present_new_only`: logits favouring NEXT, presents of zeros (past and new)."""
    rows, width = feeds["input_ids"].shape
    logits = np.zeros((rows, width, VOCAB), dtype=np.float32)
    logits[..., NEXT] = 1.0
    past = feeds[CACHE.past_names()[0]].shape[2]
    presents = [np.zeros((rows, CACHE.kv_heads, past + width, CACHE.head_size), np.float32) for _ in CACHE.past_names()]
    return [logits, *presents]


def _scheduler(max_sequences: int = 2, wait_s: float = 30.0, eos: int = EOS) -> Scheduler:
    pool = KVPool(CACHE, CACHE.bytes_per_token() * 16 * 8)  # 8 blocks of 16 tokens
    settings = GenerationSettings(max_sequences=max_sequences, prefill_chunk=4, wait_s=wait_s)
    return Scheduler(pool=pool, settings=settings, graph=GraphFeatures(vocab=VOCAB), eos_ids=[eos], run=_run)


def _sequence(prompt: list[int], most: int, stop: tuple[str, ...] = ()) -> Sequence:
    return Sequence(Job(prompt, most, Sampling(temperature=0), stop), Letters(), None)


def test_abort_all_empties_every_queue_and_gives_every_block_back() -> None:
    scheduler = _scheduler(max_sequences=2)
    running, prefilling, waiting = _sequence([1, 3], 40), _sequence([1, *range(3, 8)] * 8, 8), _sequence([1], 4)
    scheduler.waiting.extend([running, prefilling, waiting])
    scheduler.step()  # a burst (nothing runs): the first prompt in whole, 30 of the second's 48 tokens
    assert (
        scheduler.running == [running] and scheduler.prefilling == [prefilling] and list(scheduler.waiting) == [waiting]
    )
    scheduler.step()  # the first decodes in the batch beside the second's next chunk
    assert running.generated == 2 and scheduler.batch.rows == [running] and 0 < prefilling.stored < 48
    assert scheduler.pool.used_blocks == 3 + 4  # 2 + 40 tokens and 48 + 8 reserved; the waiting one holds none

    events = scheduler.abort_all(FinishReason.ERROR)

    ended = [running, prefilling, waiting]
    assert [seq for seq, _ in events] == ended
    assert [event for _, event in events] == [Event("", 2, FinishReason.ERROR), Event("", 0, FinishReason.ERROR),
                                              Event("", 0, FinishReason.ERROR)]  # fmt: skip
    assert all(seq.finish is FinishReason.ERROR and seq.blocks.size == 0 for seq in ended)
    assert not scheduler.running and not scheduler.prefilling and not scheduler.waiting and not scheduler.busy
    assert scheduler.batch.rows == [] and scheduler.pool.used_blocks == 0 and scheduler.pool.usage == 0.0

    again = _sequence([1, 3], 3)  # the scheduler serves on
    scheduler.waiting.append(again)
    while scheduler.busy:
        scheduler.step()
    assert again.finish is FinishReason.LENGTH and scheduler.pool.used_blocks == 0


def test_every_finish_reason_a_sequence_ends_with_is_a_member_of_the_enum() -> None:
    """stop (an EOS id, a stop string), length, cancelled, timeout and error: each event's reason is the enum's,
    and the enum is exactly these five."""
    assert {reason.value for reason in FinishReason} == {"stop", "length", "cancelled", "timeout", "error"}
    finished: list[FinishReason] = []

    def drain(scheduler: Scheduler) -> None:
        while scheduler.busy:
            finished.extend(e.finish for _, e in scheduler.step().events if e.finish is not None)

    scheduler = _scheduler(max_sequences=4)
    scheduler.waiting.extend([_sequence([1, 3], 3), _sequence([1, 3], 9, stop=("ff",)), cancelled := _sequence([1], 9)])
    cancelled.cancel()
    drain(scheduler)
    drain(eos := _scheduler(eos=NEXT))  # the graph's choice is an EOS id
    eos.waiting.append(_sequence([1, 3], 9))
    drain(eos)
    late = _scheduler(wait_s=0.0)
    late.waiting.append(_sequence([1, 3], 9))
    late.waiting[0].submitted = time.perf_counter() - 1
    drain(late)
    failed = _scheduler()
    failed.waiting.append(_sequence([1, 3], 9))
    finished.extend(event.finish for _, event in failed.abort_all(FinishReason.ERROR) if event.finish is not None)

    assert sorted(finished) == sorted(["cancelled", "length", "stop", "stop", "timeout", "error"])
    assert all(type(reason) is FinishReason for reason in finished)


def test_a_finish_reason_answers_as_its_bare_string() -> None:
    """The OpenAI answers (whole and chunked) and Triton's read the same bytes as with the plain strings."""
    answer = openai_api.Answer(chat=True, model="m")
    for reason in FinishReason:
        assert orjson.dumps(answer.whole("x", reason, {})) == orjson.dumps(answer.whole("x", reason.value, {}))
        assert orjson.dumps(answer.chunk("x", reason)) == orjson.dumps(answer.chunk("x", reason.value))
        assert orjson.dumps({"finish_reason": reason}) == b'{"finish_reason":"%s"}' % reason.value.encode()


def test_no_finish_reason_is_written_as_a_bare_string_in_generation() -> None:
    """Every finish reason written or compared in pipeline/serve/generation/ is the enum's."""
    values = "|".join(reason.value for reason in FinishReason)
    bare = re.compile(rf"""((finish\w*|reason)\s*(==|!=|=|\bin\b)\s*\(?|[Ee]vent\([^)]*,\s*)["']({values})["']""")
    for path in GENERATION.glob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert not bare.search(text), f"{path.name}: {bare.search(text)}"
