"""Text generation served: the engine in process (parity, batching equality, sampling, the pool, cancels,
text decoded token by token) and a real `pipe serve` answering the `openai` client, curl-style SSE and
Triton's generate, over one tiny random Llama imported once (random weights: right for parity and
batching equality, never for quality)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

import httpx
import numpy as np
import pytest

from pipeline.artifact.directory import Artifact
from pipeline.artifact.generation import DECODE_IN_PLACE
from pipeline.runtime.session import constants_of
from pipeline.serve.errors import RequestError, Unavailable
from pipeline.serve.generation.detokenizer import Detokenizer
from pipeline.serve.generation.engine import Engine
from pipeline.serve.generation.handlers import GenerationRoutes
from pipeline.serve.generation.sampler import Sampling
from pipeline.serve.generation.scheduler import _calls, burst_budget
from pipeline.serve.generation.sequence import Job, Sequence
from pipeline.serve.generation.served import TextGenerator
from pipeline.serve.generation.settings import GenerationSettings
from pipeline.serve.routes import Request as HttpRequest
from pipeline.serve.session import ModelSession, SessionOptions
from tests.lm.imported_lm import NAME, imported_llama
from tests.lm.lm_models import LINES
from tests.serve.serve_process import Server, metric, start_server, wait_for

pytestmark = pytest.mark.slow  # one import of a tiny Llama (about 20 s of CPU) when the test model cache lacks it

CONTEXT = 512  # long enough that a stream outlives its client's disconnect by many steps
# four requests (prompt ids, most new tokens): the second ends first, the fourth joins into its row, the third
# outgrows the batch array's width
LEAVE_AND_JOIN = (
    ([1, *range(40, 69)], 8),
    ([1, 7, 8, 9, 10, 11], 3),
    ([1, *range(100, 107)], 60),
    ([1, 5, 6, 7, 8], 16),
)
PROMPTS = ["The quick brown fox", "Once upon a time, in a small village by the sea", "def add(a, b):", "1, 2"]


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The source directory (transformers) and the served repository of one tiny Llama: a copy of the
    import cached across runs (tests/lm/imported_lm.py)."""
    return imported_llama(tmp_path_factory.mktemp("lm-serve"), CONTEXT)


@pytest.fixture(scope="module")
def reference(imported: tuple[Path, Path]) -> Any:
    """transformers' greedy generation on the source model: the parity gate's reference."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(imported[0], attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(imported[0])

    def greedy(ids: list[int], steps: int, **options: Any) -> list[int]:
        config = GenerationConfig(do_sample=False, max_new_tokens=steps, eos_token_id=2, pad_token_id=0, **options)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.int64),
                                 generation_config=config)  # fmt: skip
        made = out[0, len(ids) :].tolist()
        return made[: made.index(2) + 1] if 2 in made else made

    greedy.tokenizer = tokenizer  # type: ignore[attr-defined]
    return greedy


def _generator(repository: Path, graph: Path | None = None, **settings: Any) -> TextGenerator:
    """The engine of the imported version, on its model.onnx or on `graph` (another graph of the same model), the
    session made as pipe serve makes it."""
    root = repository / NAME / "1"
    manifest = Artifact.load(root).manifest
    session = ModelSession(graph or root / "model.onnx", SessionOptions("cpu", 1, 1, False), manifest).session
    made = TextGenerator.of(root, manifest, session, GenerationSettings(**settings), None)
    assert made is not None
    return made


async def _drain(seq: Sequence) -> tuple[list[int], str, str]:
    """The sequence's new tokens, its text as streamed, and its finish reason."""
    assert seq.events is not None
    text = ""
    while True:
        event = await seq.events.get()
        text += event.text
        if event.finish is not None:
            return seq.tokens[len(seq.job.prompt) :], text, event.finish


class Gated(ThreadPoolExecutor):
    """A compute pool whose jobs start once `open` is set: requests submitted before are all waiting when the
    step thread starts, however the threads are scheduled."""

    def __init__(self) -> None:
        super().__init__(1)
        self.open = threading.Event()

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        def gated() -> Any:
            self.open.wait(30)  # past that the job runs anyway: the test fails on its assertions, it does not hang
            return fn(*args, **kwargs)

        return super().submit(gated)


class Counting:
    """The scheduler's onnxruntime calls (and its decode calls in place), counting the rows of each decode call (one
    new token per row)."""

    def __init__(self, engine: Engine) -> None:
        self.decode_rows: list[int] = []
        scheduler = engine.scheduler

        def counting(run: Any) -> Any:
            def counted(feeds: dict[str, np.ndarray], *keep: bool) -> Any:
                if feeds["input_ids"].shape[1] == 1:
                    self.decode_rows.append(feeds["input_ids"].shape[0])
                return run(feeds, *keep)

            return counted

        scheduler._run = counting(scheduler._run)
        if scheduler._run_in_place is not None:
            scheduler._run_in_place = counting(scheduler._run_in_place)


# -- the engine, in process ----------------------------------------------------------------------


def test_greedy_equals_transformers_while_requests_join_mid_decode(imported: tuple[Path, Path], reference: Any) -> None:
    """Prompts arriving one after another, prefilled in chunks of 4 tokens beside the running decodes: each
    sequence's greedy tokens equal transformers' generate(do_sample=False) on it alone."""
    gen = _generator(imported[1], prefill_chunk=4)
    counting = Counting(gen.engine)
    prompts = [gen.encode(p, True) for p in PROMPTS]

    async def run() -> list[tuple[list[int], str, str]]:
        seqs = []
        for ids in prompts:
            seqs.append(gen.engine.submit(Job(ids, 24, Sampling(temperature=0))))
            await asyncio.sleep(0.003)  # later ones join while the first decode
        return [await _drain(s) for s in seqs]

    for ids, (tokens, text, finish) in zip(prompts, asyncio.run(run()), strict=True):
        expected = reference(ids, 24)
        assert tokens == expected
        assert text == gen.decode(tokens) and finish == ("stop" if expected[-1] == 2 else "length")
    assert max(counting.decode_rows) > 1  # decode steps were shared
    assert gen.engine.pool.used_blocks == 0  # every block given back


def test_sixteen_sequences_decode_in_one_call_a_step_each_as_alone(imported: tuple[Path, Path]) -> None:
    gen = _generator(imported[1])
    rng = np.random.default_rng(0)
    prompts = [[1, *rng.integers(3, 300, size=int(rng.integers(2, 30))).tolist()] for _ in range(16)]

    async def run(batch: list[list[int]]) -> list[list[int]]:
        seqs = [gen.engine.submit(Job(ids, 12, Sampling(temperature=0))) for ids in batch]
        gate.open.set()
        return [(await _drain(s))[0] for s in seqs]

    gen.engine._executor = gate = Gated()  # the step thread starts with all 16 waiting
    alone = [asyncio.run(run([ids]))[0] for ids in prompts]
    counting = Counting(gen.engine)
    wait_for(lambda: not gen.engine._stepping, 5)  # else the last job, still stepping, would take them ungated
    gate.open.clear()
    together = asyncio.run(run(prompts))
    assert together == alone
    assert max(counting.decode_rows) == 16  # every running row in one onnxruntime call


def _join_beside(gen: TextGenerator, running: list[list[int]], joining: list[list[int]]) -> tuple[list[Sequence], ...]:
    """Greedy sequences of the `running` prompts after their first step, and of the `joining` prompts after
    their first step beside them (the scheduler stepped by hand)."""
    scheduler = gen.engine.scheduler
    made = []
    for prompts, most in ((running, 8), (joining, 4)):
        made.append([Sequence(Job(ids, most, Sampling(temperature=0)), gen.tokenizer, None) for ids in prompts])
        scheduler.waiting.extend(made[-1])
        scheduler.step()
    return tuple(made)


def test_prompts_are_prefilled_oldest_first_within_the_chunk(imported: tuple[Path, Path]) -> None:
    """While three sequences run, a chunk of 8 over three 6-token prompts: the oldest is prefilled whole in the
    first step (and has its first token), the second gets the 2 tokens left, the third waits; nobody's first
    token waits for all."""
    gen = _generator(imported[1], prefill_chunk=8)
    running, seqs = _join_beside(gen, [[1, 5], [1, 6], [1, 7]], [[1, *range(10 + i, 15 + i)] for i in range(3)])
    assert [s.stored for s in seqs] == [6, 2, 0]
    assert [s.generated for s in seqs] == [1, 0, 0] and gen.engine.scheduler.running == [*running, seqs[0]]
    gen.engine.scheduler.step()  # the first decodes its second token beside the next chunk
    assert [s.stored for s in seqs] == [7, 6, 4] and [s.generated for s in seqs] == [2, 1, 0]


def test_a_burst_is_prefilled_in_one_call(imported: tuple[Path, Path]) -> None:
    """One sequence runs and three 16-token prompts arrive: more wait for a first token than for a next one,
    so the step prefills all three (up to 8 chunks of 8) and they decode with it from the next step; the
    logits' size caps that budget where the graph computes every position's."""
    gen = _generator(imported[1], prefill_chunk=8)
    assert gen.engine.scheduler.burst_chunk == 64
    running, seqs = _join_beside(gen, [[1, 5]], [[1, *range(10 + i, 25 + i)] for i in range(3)])
    assert [s.stored for s in seqs] == [16, 16, 16] and gen.engine.scheduler.running == [*running, *seqs]
    assert burst_budget(256, 49_152) == 2048  # SmolLM's vocabulary: 2048 x 49,152 fp32 logits are 384 MiB
    assert burst_budget(256, 128_256) == 1046  # Llama 3's: 512 MiB of logits
    assert burst_budget(256, 1_000_000) == 256  # never below one chunk
    assert burst_budget(256, 0) == 2048  # a graph computing the last column's logits only: no cap by their size


def test_prefill_calls_in_place_group_the_rows_starting_a_prompt_of_one_length() -> None:
    """GroupQueryAttention takes several rows of several tokens only when none has a past: rows starting their
    prompt with the same take share a call, in the chunk's order; a row continuing its prompt goes alone."""
    from types import SimpleNamespace

    a, b, c, d, e = (SimpleNamespace(stored=s) for s in (0, 0, 8, 0, 4))
    calls = _calls([(a, 16), (b, 16), (c, 8), (d, 5), (e, 16)])  # type: ignore[list-item]
    assert [([id(r) for r in rows], take) for rows, take in calls] == [
        ([id(a), id(b)], 16), ([id(d)], 5), ([id(c)], 8), ([id(e)], 16)
    ]  # fmt: skip


def test_rows_leaving_and_joining_move_in_the_batch_array(imported: tuple[Path, Path], reference: Any) -> None:
    """A, B and C decode from one array; B ends and C takes its row; D joins into the next row, read from the
    pool; C outgrows the array's width once. The array is made twice (for three rows, then wider), no decode
    step gathers from the pool, and every sequence equals its answer alone; run again, in the same memory."""
    gen = _generator(imported[1], prefill_chunk=64)
    scheduler = gen.engine.scheduler
    # a written decoder, served with `decode_in_place` a constant: its calls write into the array and the scratch
    assert scheduler._run_in_place is not None and constants_of(gen.engine._session) == {DECODE_IN_PLACE}
    gathered: list[int] = []  # rows of each pool gather with a past (a fresh prompt's prefill gathers nothing)
    gather = scheduler.pool.gather

    def recording(tables: list[np.ndarray], lengths: list[int]) -> Any:
        if any(lengths):
            gathered.append(len(tables))
        return gather(tables, lengths)

    scheduler.pool.gather = recording  # type: ignore[method-assign]
    a, b, c, d = LEAVE_AND_JOIN
    seqs = [Sequence(Job(ids, n, Sampling(temperature=0)), gen.tokenizer, None) for ids, n in (a, b, c, d)]
    scheduler.waiting.extend(seqs[:3])
    for _ in range(3):
        scheduler.step()
    assert seqs[1].finish == "length" and scheduler.batch.remade == 1
    width = scheduler.batch.data.shape[3]
    scheduler.waiting.append(seqs[3])  # joins while A and C run on
    for _ in range(2):
        scheduler.step()
    assert [id(s) for s in scheduler.batch.rows] == [id(seqs[0]), id(seqs[2]), id(seqs[3])]  # C in B's row
    assert scheduler.batch.remade == 1
    while scheduler.busy:
        scheduler.step()
    assert gathered == [] and scheduler.batch.remade == 2 and len(seqs[2].tokens) > width
    for seq, (ids, n) in zip(seqs, (a, b, c, d), strict=True):
        assert seq.tokens[len(ids) :] == reference(ids, n)
    # the same four again: the array is made twice more, in the buffers the first run wrote (no new memory),
    # whose holes hold the first run's keys and values (and its prefills'), and nothing of them reaches the answers
    allocated = scheduler.batch.allocated
    again = [Sequence(Job(ids, n, Sampling(temperature=0)), gen.tokenizer, None) for ids, n in (a, b, c, d)]
    scheduler.waiting.extend(again[:3])
    for _ in range(3):
        scheduler.step()
    scheduler.waiting.append(again[3])
    while scheduler.busy:
        scheduler.step()
    assert scheduler.batch.remade == 4 and scheduler.batch.allocated == allocated
    assert [seq.tokens for seq in again] == [seq.tokens for seq in seqs]


def test_a_traced_graph_decodes_by_appending_its_presents_last_column(
    imported: tuple[Path, Path], reference: Any, tmp_path: Path
) -> None:
    """A graph without the written decoder's optional inputs (what a family the writer refuses is exported as:
    here the tiny Llama traced on purpose) gives its presents concatenated; the engine appends their last column
    to the batch array. Rows ending, joining and outgrowing the array, every sequence equals its answer alone."""
    from transformers import AutoModelForCausalLM

    from pipeline.export.lm_module import export_decoder
    from pipeline.runtime.decoder import CachedDecoder, cache_layout

    decoder = CachedDecoder(AutoModelForCausalLM.from_pretrained(imported[0], attn_implementation="eager")).eval()
    traced = tmp_path / "traced.onnx"
    assert export_decoder(decoder, cache_layout(decoder), traced, 18, fused=False).exporter != "fused"
    gen = _generator(imported[1], graph=traced, prefill_chunk=64)
    scheduler = gen.engine.scheduler
    assert scheduler._run_in_place is None and not scheduler._new_presents
    asked = LEAVE_AND_JOIN
    seqs = [Sequence(Job(ids, n, Sampling(temperature=0)), gen.tokenizer, None) for ids, n in asked]
    scheduler.waiting.extend(seqs[:3])
    for _ in range(3):
        scheduler.step()
    scheduler.waiting.append(seqs[3])  # joins into the row the second left
    while scheduler.busy:
        scheduler.step()
    assert scheduler.batch.remade >= 2
    for seq, (ids, n) in zip(seqs, asked, strict=True):
        assert seq.tokens[len(ids) :] == reference(ids, n)


def test_a_seed_repeats_sampling_whatever_runs_beside_it(imported: tuple[Path, Path]) -> None:
    gen = _generator(imported[1])
    ids = gen.encode(PROMPTS[0], True)
    sampling = Sampling(temperature=0.9, top_p=0.95, top_k=50, seed=7)

    async def run(requests: list[Job]) -> list[list[int]]:
        seqs = [gen.engine.submit(r) for r in requests]
        return [(await _drain(s))[0] for s in seqs]

    first = asyncio.run(run([Job(ids, 16, sampling)]))[0]
    beside = asyncio.run(run([Job(ids, 16, Sampling(temperature=1.0, seed=1)), Job(ids, 16, sampling)]))[1]
    other = asyncio.run(run([Job(ids, 16, Sampling(temperature=0.9, top_p=0.95, top_k=50, seed=8))]))[0]
    assert first == beside
    assert first != other


def test_the_pool_bounds_the_sequences_and_refuses_what_never_fits(imported: tuple[Path, Path]) -> None:
    """A pool of 4 blocks (64 tokens): two sequences of 20 + 12 tokens fit at once, the others wait; one
    needing more than the whole pool is a 400; a full queue a 503; a prompt filling the context a 400."""
    gen = _generator(imported[1], kv_cache_mb=4 * 16 * gen_bytes(imported[1]) / 2**20, max_waiting=3)
    engine = gen.engine
    assert engine.pool.capacity_tokens == 64
    with pytest.raises(RequestError, match="pool holds 64"):
        engine.check(40, 40)
    with pytest.raises(RequestError, match="context length is 512"):
        engine.check(512, 1)
    ids = [1, *range(10, 29)]
    running: list[int] = []
    engine._executor = gate = Gated()  # the step thread starts once all are submitted: 3 get in, 2 run at once
    counting = Counting(engine)

    async def run() -> list[list[int]]:
        seqs: list[Sequence] = []
        with pytest.raises(Unavailable, match=r"^3 requests are already waiting for this model \(--max-waiting 3\)"):
            for _ in range(6):
                seqs.append(engine.submit(Job(ids, 12, Sampling(temperature=0))))
        assert 3 <= len(seqs) <= 5
        gate.open.set()
        while not all(s.finish for s in seqs):
            running.append(len(engine.scheduler.running) + len(engine.scheduler.prefilling))
            await asyncio.sleep(0)
        return [(await _drain(s))[0] for s in seqs]

    made = asyncio.run(run())
    assert all(m == made[0] for m in made) and max(running) <= 2
    assert max(counting.decode_rows) == 2  # two decoded in one call (the loop's samples above may miss it)
    assert engine.pool.used_blocks == 0


def test_a_step_that_raises_ends_its_sequences_with_error_and_the_engine_serves_on(imported: tuple[Path, Path]) -> None:
    """A decode call that raises (a device fault): the sequences of that step end `error` with their blocks freed,
    and the step thread goes on to serve the next request."""
    gen = _generator(imported[1])
    scheduler = gen.engine.scheduler
    run, faults = scheduler._run_in_place, [RuntimeError("a device fault")]
    assert run is not None

    def failing_once(feeds: dict[str, np.ndarray], keep: bool) -> np.ndarray:
        if keep and faults and len(feeds["input_ids"]) == 2:  # the first decode of both (the second may join late)
            raise faults.pop()
        return run(feeds, keep)

    scheduler._run_in_place = failing_once
    greedy = Sampling(temperature=0)

    async def go() -> tuple[list[str], tuple[list[int], str, str]]:
        first = [gen.engine.submit(Job([1, 5, 6 + i], 64, greedy)) for i in range(2)]
        ended = [(await _drain(seq))[2] for seq in first]
        return ended, await _drain(gen.engine.submit(Job([1, 5, 6], 8, greedy)))

    ended, (tokens, _, finish) = asyncio.run(go())
    assert ended == ["error", "error"] and finish == "length" and len(tokens) == 8
    assert gen.engine.pool.used_blocks == 0
    wait_for(lambda: not gen.engine._stepping, 5)  # the step thread stops once nothing is left to do


def test_requests_from_one_event_loop_after_another_are_all_answered(imported: tuple[Path, Path]) -> None:
    """An engine driven from a new event loop as soon as the last one closed (a bench's cells, tests): the step
    thread may still be running for the old loop when the new request comes; its events reach the new one."""
    gen = _generator(imported[1])
    post = gen.engine._post

    def post_then_stall(call: Any, *args: Any) -> None:  # the step thread descheduled after handing out events
        post(call, *args)
        time.sleep(0.05)

    gen.engine._post = post_then_stall  # type: ignore[method-assign]

    async def one(i: int) -> str:
        seq = gen.engine.submit(Job([1, 5, 6 + i], 2, Sampling(temperature=0)))
        return (await asyncio.wait_for(_drain(seq), 30))[2]

    assert [asyncio.run(one(i)) for i in range(8)] == ["length"] * 8


def test_a_request_once_the_compute_pool_is_shut_down_is_refused_and_leaves_nothing(
    imported: tuple[Path, Path],
) -> None:
    gen = _generator(imported[1])
    pool = ThreadPoolExecutor(1)
    pool.shutdown()
    gen.engine._executor = pool

    async def submit() -> None:
        gen.engine.submit(Job([1, 5, 6], 2, Sampling(temperature=0)))

    with pytest.raises(Unavailable, match="shutting down"):
        asyncio.run(submit())
    assert not gen.engine._stepping and gen.engine._incoming == []


def gen_bytes(repository: Path) -> int:
    generation = Artifact.load(repository / NAME / "1").manifest.generation
    assert generation is not None
    return generation.cache.bytes_per_token()


def test_a_cancelled_sequence_is_dropped_at_the_next_step(imported: tuple[Path, Path]) -> None:
    gen = _generator(imported[1])
    assert gen.engine.check(500, None) == gen.engine.check(500, 100) == 12  # what the context leaves

    async def run() -> tuple[int, int, str, int]:
        seq = gen.engine.submit(Job([1, 5, 6, 7], 400, Sampling(temperature=0)))
        assert seq.events is not None
        while seq.generated < 3:
            await seq.events.get()
        seq.cancel()
        at_cancel = seq.generated  # the step thread may be in a step that makes one more token
        _, _, finish = await _drain(seq)
        return at_cancel, seq.generated, finish, gen.engine.pool.used_blocks

    at_cancel, generated, finish, used = asyncio.run(run())
    assert finish == "cancelled" and generated <= at_cancel + 1 and used == 0


def test_a_sequence_waiting_past_the_bound_leaves_the_queue(imported: tuple[Path, Path]) -> None:
    gen = _generator(imported[1], max_sequences=1, wait_s=0.05)

    async def run() -> tuple[str | None, int, int]:
        holder = gen.engine.submit(Job([1, 5, 6, 7], 400, Sampling(temperature=0)))
        waiting = gen.engine.submit(Job([1, 8, 9], 4, Sampling(temperature=0)))
        assert waiting.events is not None
        finish = (await waiting.events.get()).finish
        made, left = holder.generated, len(gen.engine.scheduler.waiting)
        holder.cancel()
        await _drain(holder)
        return finish, made, left

    finish, made, left = asyncio.run(run())
    assert finish == "timeout" and 0 < made < 400 and left == 0  # it left while the one place was still taken
    assert gen.engine.pool.used_blocks == 0


def test_text_is_decoded_token_by_token_without_splitting_a_character(imported: tuple[Path, Path]) -> None:
    gen = _generator(imported[1])
    text = "héllo wörld: 日本語 🎉 naïve"
    ids = gen.encode(text, False)
    detokenizer = Detokenizer(gen.tokenizer, [1])
    pieces = [detokenizer.add(i) for i in ids] + [detokenizer.flush()]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    assert len([p for p in pieces if p]) > 5  # it streamed, not all at the end


def test_a_chat_request_to_a_model_without_a_template_is_a_400_naming_it(imported: tuple[Path, Path]) -> None:
    gen = _generator(imported[1])
    gen.chat = None  # as a model whose tokenizer had no chat template is loaded

    class Repo:
        models: ClassVar[dict[str, dict[int, None]]] = {NAME: {1: None}}

        def get(self, name: str, version: str | None, label: str | None = None) -> Any:
            return type("Loaded", (), {"name": NAME, "version": 1, "task": "text-generation", "generator": gen})

    body = json.dumps({"model": NAME, "messages": [{"role": "user", "content": "hi"}]}).encode()
    status, answer, _ = asyncio.run(GenerationRoutes(Repo).chat(HttpRequest({}, body)))
    error = json.loads(answer)["error"]
    assert status == 400 and "no chat template" in error["message"] and NAME in error["message"]
    assert error["type"] == "invalid_request_error" and error["param"] == "model"


# -- a real server: the openai client, SSE, Triton's generate ------------------------------------


@pytest.fixture(scope="module")
def server(imported: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    logs = tmp_path_factory.mktemp("lm-serve-log")
    running = start_server([imported[1]], logs / "serve.log", "--poll", "0", "--prefill-chunk", "8",
                           "--access-log", str(logs / "access.jsonl"))  # fmt: skip
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server: Server) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def _chat_ids(reference: Any, messages: list[dict[str, str]]) -> list[int]:
    rendered = reference.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return reference.tokenizer(rendered, add_special_tokens=False)["input_ids"]


def test_openai_chat_gives_the_greedy_text_whole_and_streamed(client: Any, reference: Any) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a model?"}]
    expected = reference(_chat_ids(reference, messages), 16)
    text = reference.tokenizer.decode(expected, skip_special_tokens=True)
    whole = client.chat.completions.create(model=NAME, messages=messages, temperature=0, max_tokens=16)
    assert whole.choices[0].message.content == text and whole.choices[0].message.role == "assistant"
    assert whole.choices[0].finish_reason == ("stop" if expected[-1] == 2 else "length")
    assert whole.usage.completion_tokens == len(expected)
    assert whole.usage.prompt_tokens == len(_chat_ids(reference, messages))
    chunks = list(client.chat.completions.create(model=NAME, messages=messages, temperature=0, max_tokens=16,
                                                 stream=True, stream_options={"include_usage": True}))  # fmt: skip
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == len(expected)


def test_completions_and_raw_sse_as_openai_sends_them(server: Server, client: Any, reference: Any) -> None:
    ids = reference.tokenizer(LINES[1])["input_ids"]
    text = reference.tokenizer.decode(reference(ids, 20), skip_special_tokens=True)
    assert client.completions.create(model=NAME, prompt=LINES[1], temperature=0, max_tokens=20).choices[0].text == text
    body = {"model": NAME, "prompt": LINES[1], "temperature": 0, "max_tokens": 20, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=30) as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        raw = answer.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"text_completion"}
    assert "".join(c["choices"][0]["text"] for c in chunks) == text


def test_sixteen_concurrent_streams_each_equal_its_single_answer(client: Any) -> None:
    prompts = [f"{LINES[i % len(LINES)]} {i}" for i in range(16)]

    def alone(prompt: str) -> str:
        return client.completions.create(model=NAME, prompt=prompt, temperature=0, max_tokens=24).choices[0].text

    def streamed(prompt: str) -> str:
        chunks = client.completions.create(model=NAME, prompt=prompt, temperature=0, max_tokens=24, stream=True)
        return "".join(c.choices[0].text for c in chunks)

    single = [alone(p) for p in prompts]
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(streamed, prompts))
    assert together == single


def _metric(server: Server, name: str) -> float:
    return metric(server, name, NAME)


def test_a_client_that_disconnects_frees_its_sequence(server: Server) -> None:
    """A stream asking for 480 tokens is closed after 3 events: the sequence ends early (the access log's
    tokens_out), nothing runs and the pool is empty again."""
    body = {"model": NAME, "prompt": "1, 2, 3", "temperature": 0, "max_tokens": 480, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=30) as answer:
        lines = answer.iter_lines()
        assert [next(lines) for _ in range(5)]  # three events and their blank lines, read as they come
    access = server.log.parent / "access.jsonl"

    def logged() -> list[dict[str, Any]]:
        rows = [json.loads(x) for x in access.read_text().splitlines()] if access.exists() else []
        return [r for r in rows if r["route"] == "/v1/completions" and r["tokens_in"] == 8 and r["tokens_out"]]

    wait_for(lambda: any(r["tokens_out"] < 480 for r in logged()), timeout=20)
    wait_for(lambda: _metric(server, "pipe_sequences_running") == 0 == _metric(server, "pipe_kv_cache_usage_ratio"))


def test_triton_generate_and_generate_stream(server: Server, reference: Any) -> None:
    ids = reference.tokenizer(LINES[0])["input_ids"]
    text = reference.tokenizer.decode(reference(ids, 12), skip_special_tokens=True)
    body = {"text_input": LINES[0], "parameters": {"max_tokens": 12, "temperature": 0}}
    whole = httpx.post(f"{server.url}/v2/models/{NAME}/generate", json=body).json()
    assert whole["text_output"] == text and whole["model_name"] == NAME and whole["model_version"] == "1"
    with httpx.stream("POST", f"{server.url}/v2/models/{NAME}/versions/1/generate_stream", json=body) as answer:
        events = [json.loads(e.removeprefix("data: ")) for e in answer.read().decode().split("\n\n") if e]
    assert "".join(e["text_output"] for e in events) == text and events[-1]["finish_reason"] == whole["finish_reason"]


def test_a_repetition_penalty_gives_transformers_tokens_under_it(server: Server, client: Any, reference: Any) -> None:
    """Greedy under repetition_penalty 1.3 (OpenAI route, a vLLM-style extra field; Triton's generate) makes
    the tokens transformers' generate makes under the same penalty, and they differ from plain greedy's."""
    ids = reference.tokenizer(LINES[1])["input_ids"]
    plain, penalized = reference(ids, 16), reference(ids, 16, repetition_penalty=1.3)
    assert plain != penalized  # the penalty changes this prompt's answer
    answer = client.completions.create(model=NAME, prompt=ids, max_tokens=16, temperature=0,
                                       extra_body={"repetition_penalty": 1.3})  # fmt: skip
    assert answer.choices[0].text == reference.tokenizer.decode(penalized, skip_special_tokens=True)
    body = {"text_input": LINES[1], "parameters": {"max_tokens": 16, "temperature": 0, "repetition_penalty": 1.3}}
    whole = httpx.post(f"{server.url}/v2/models/{NAME}/generate", json=body).json()
    assert whole["text_output"] == reference.tokenizer.decode(penalized, skip_special_tokens=True)


def test_refusals_are_openai_errors(server: Server, client: Any) -> None:
    import openai

    refusals = (({"temperature": 5}, "temperature"), ({"n": 2}, "n"), ({"top_p": 0}, "top_p"),
                ({"presence_penalty": 3}, "presence_penalty"), ({"frequency_penalty": -2.5}, "frequency_penalty"),
                ({"extra_body": {"repetition_penalty": 0}}, "repetition_penalty"))  # fmt: skip
    for bad, param in refusals:
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model=NAME, prompt="hi", max_tokens=2, **bad)
        assert refused.value.body["param"] == param
    with pytest.raises(openai.NotFoundError, match="unknown model 'nope'"):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="context length is 512"):
        client.completions.create(model=NAME, prompt=list(range(3, 259)) * 2, max_tokens=2)
    with pytest.raises(openai.BadRequestError, match=r"token id 320 is outside the vocabulary \[0, 320\)"):
        client.completions.create(model=NAME, prompt=[1, 320], max_tokens=2)
    answer = httpx.post(f"{server.url}/v2/models/{NAME}/generate", json={"text_input": 3})
    assert answer.status_code == 400 and "text_input must be a string" in answer.json()["error"]
    assert [m.id for m in client.models.list()] == [NAME]
    retrieved = client.models.retrieve(NAME)  # GET /v1/models/{m}: TF Serving's status, OpenAI's fields beside
    assert retrieved.id == NAME and retrieved.object == "model"
    status = httpx.get(f"{server.url}/v1/models/{NAME}").json()
    assert status["model_version_status"][0]["state"] == "AVAILABLE"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


def test_metrics_count_tokens_and_time_them(server: Server, client: Any) -> None:
    before = _metric(server, "pipe_generation_tokens_total")
    client.completions.create(model=NAME, prompt="1, 2", temperature=0, max_tokens=5)
    wait_for(lambda: _metric(server, "pipe_generation_tokens_total") >= before + 1)
    assert _metric(server, "pipe_time_to_first_token_seconds_count") > 0
    assert _metric(server, "pipe_time_per_output_token_seconds_count") > 0
    assert _metric(server, "pipe_decode_rows_total") >= _metric(server, "pipe_decode_steps_total") > 0


def test_a_text_longer_than_the_context_can_hold_is_refused_before_it_is_read(imported: tuple[Path, Path]) -> None:
    """A prompt, chat contents or Triton text_input of more characters than the context could hold in its
    longest tokens is a 400 naming the field, and neither the tokenizer nor the chat template reads it: a
    20 MB prompt once held the GIL for 20 s while it was tokenized, and kept 1.7 GB."""
    gen = _generator(imported[1])
    bound = gen.engine.context_length * gen.longest_token
    read: list[str] = []

    class Watched:  # the tokenizer and the template, each read recorded
        def __init__(self, inner: Any, what: str) -> None:
            self.inner, self.what = inner, what

        def __getattr__(self, name: str) -> Any:
            read.append(f"{self.what}.{name}")
            return getattr(self.inner, name)

    gen.tokenizer, gen.chat = Watched(gen.tokenizer, "tokenizer"), Watched(gen.chat, "template")  # type: ignore[assignment]

    class Repo:
        models: ClassVar[dict[str, dict[int, None]]] = {NAME: {1: None}}

        def get(self, name: str, version: str | None, label: str | None = None) -> Any:
            return type("Loaded", (), {"name": NAME, "version": 1, "task": "text-generation", "generator": gen})

    routes = GenerationRoutes(Repo)
    text = "a" * (bound + 1)
    half = {"role": "user", "content": "a" * (bound // 2 + 1)}
    cases = [
        (routes.completions, {"model": NAME, "prompt": text, "max_tokens": 4}, "prompt"),
        (routes.chat, {"model": NAME, "messages": [half, half], "max_tokens": 4}, "messages"),
    ]
    for route, body, field in cases:
        status, answer, _ = asyncio.run(route(HttpRequest({}, json.dumps(body).encode())))
        error = json.loads(answer)["error"]
        assert status == 400 and error["param"] == field, error
        assert (
            f"the prompt is {bound + 1 if field == 'prompt' else 2 * (bound // 2 + 1):,} characters" in error["message"]
        )
    body = json.dumps({"text_input": text, "parameters": {"max_tokens": 4}}).encode()
    with pytest.raises(RequestError, match="characters") as refused:  # the app answers it {"error"}, 400
        asyncio.run(routes.generate(HttpRequest({}, body, model_name=NAME)))
    assert refused.value.status == 400 and refused.value.param == "text_input"
    assert read == []  # refused unread
    # at the bound the text is read: refused by its tokens (there are far more than 512), not by its length
    body = json.dumps({"model": NAME, "prompt": "a " * (bound // 2), "max_tokens": 4}).encode()
    status, answer, _ = asyncio.run(routes.completions(HttpRequest({}, body)))
    assert status == 400 and "tokens, and this model's context length is 512" in json.loads(answer)["error"]["message"]
    assert "tokenizer.encode" in read
