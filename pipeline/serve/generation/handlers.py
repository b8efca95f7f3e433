"""The generation routes' handlers: OpenAI's `/v1/chat/completions`, `/v1/completions` and `/v1/models`,
and Triton's `/v2/models/{m}/generate` and `generate_stream`.

Each reads its body (`params.py`, `openai_api.py`), makes the prompt's token ids (the chat template
rendered and the text tokenized in a worker thread, off the event loop), has the engine check and
queue it, and answers: whole once the sequence finishes, or as Server-Sent Events while it runs
(`stream.py`), once it has its first token. Until then (and, unstreamed, until the answer is whole)
the connection is watched: a client that leaves cancels its sequence, freed at the engine's next step,
and the access log records 499 (nginx's "client closed request"). A request that waited past the
server's --timeout for a place is a 503 with Retry-After, before any header of a stream is sent. The
access log's record gets the tokens in and out.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from pipeline.serve.errors import NotFound, RequestError, Unavailable
from pipeline.serve.generation import openai_api
from pipeline.serve.generation.openai_api import Answer
from pipeline.serve.generation.params import Params, read_params
from pipeline.serve.generation.sequence import Event, FinishReason, Job, Sequence
from pipeline.serve.generation.served import TextGenerator
from pipeline.serve.generation.stream import DONE, Receive, Streaming, event
from pipeline.serve.responses import Response, json_response
from pipeline.serve.routes import Request
from pipeline.serve.timing import current_request

if TYPE_CHECKING:
    from pipeline.serve.repository import Repository
    from pipeline.serve.served_version import LoadedVersion

TRITON_PARAMS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "repetition_penalty",
                 "frequency_penalty", "presence_penalty")  # fmt: skip
CLIENT_GONE = 499  # nginx's "client closed request": the status logged for an answer nobody is left to read
T = TypeVar("T")


def _body(request: Request) -> dict[str, Any]:
    try:
        body = orjson.loads(request.body)
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError(f"the body must be a JSON object, got {type(body).__name__}")
    return body


async def _text(sequence: Sequence) -> tuple[str, FinishReason]:
    """The whole answer and its finish reason, once the sequence ends."""
    assert sequence.events is not None
    parts = []
    while True:
        step = await sequence.events.get()
        parts.append(step.text)
        if step.finish is not None:
            return "".join(parts), step.finish


async def _steps(sequence: Sequence, first: Event) -> AsyncIterator[Event]:
    """The sequence's events from `first` on, until its last."""
    assert sequence.events is not None
    step = first
    while True:
        yield step
        if step.finish is not None:
            return
        step = await sequence.events.get()


async def _until_gone(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _watching(request: Request, sequence: Sequence, work: Awaitable[T]) -> T:
    """`work`'s result; the client leaving meanwhile cancels the sequence (its events then end `cancelled`)."""
    if request.receive is None:  # called in process, without a connection
        return await work
    watcher = asyncio.get_running_loop().create_task(_until_gone(request.receive))
    watcher.add_done_callback(lambda task: None if task.cancelled() or task.exception() else sequence.cancel())
    try:
        return await work
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher  # a stream's own watch (stream.py) takes `receive` over only once this one is gone


def _count(sequence: Sequence) -> None:
    """The access log's tokens in and out."""
    if (record := current_request.get()) is not None:
        record.prompt_tokens, record.completion_tokens = len(sequence.job.prompt), sequence.generated


def _finished(reason: FinishReason, generator: TextGenerator) -> FinishReason:
    """The finish reason of an answer (`stop` or `length`), or the refusal it stands for."""
    if reason == FinishReason.ERROR:
        raise RequestError("generation failed on the server; the log has the traceback", 500)
    if reason == FinishReason.CANCELLED:
        raise RequestError("the client closed the connection before the answer was ready", CLIENT_GONE)
    if reason == FinishReason.TIMEOUT:
        settings = generator.engine.settings
        raise Unavailable(
            f"the request waited {settings.wait_s:g}s (--timeout) for a place beside the sequences being generated "
            f"(--max-sequences {settings.max_sequences}, --kv-cache-mb {settings.kv_cache_mb:g}) and was removed "
            "from the queue; the server is overloaded, retry after a moment"
        )
    return reason


async def _first(request: Request, sequence: Sequence, generator: TextGenerator) -> Event:
    """A stream's first event (its first token, or its end), before any header is sent: a refusal is still
    an ordinary answer with its status."""
    assert sequence.events is not None
    first = await _watching(request, sequence, sequence.events.get())
    if first.finish in (FinishReason.CANCELLED, FinishReason.TIMEOUT):
        _finished(first.finish, generator)
    return first


class GenerationRoutes:
    """The handlers, over the server's repository (`repo()` gives it, or raises 503 while starting)."""

    def __init__(self, repo: Callable[[], Repository]) -> None:
        self._repo = repo

    def _generator(
        self, name: object, version: str | None = None, label: str | None = None
    ) -> tuple[LoadedVersion, TextGenerator]:
        if not isinstance(name, str):
            raise RequestError(f"model must be the name of a served model, got {name!r:.40}", param="model")
        try:
            model = self._repo().get(name, version, label)
        except NotFound as exc:
            raise NotFound(str(exc)).with_param("model") from None
        if (record := current_request.get()) is not None:
            record.model, record.version = model.name, model.version
        if model.generator is None:
            raise RequestError(
                f"model {name!r} is a {model.task} model; generation takes a text-generation model "
                f"({', '.join(self.generation_models()) or 'none is served'})",
                param="model",
            )
        return model, model.generator

    def generation_models(self) -> list[str]:
        repo = self._repo()
        return sorted(n for n in repo.models if repo.get(n, None).generator is not None)

    async def _submit(
        self, generator: TextGenerator, prompt: str | list[int], chat: bool, params: Params, field: str
    ) -> Sequence:
        """The prompt (`field` of the body: a refusal names it) tokenized, checked and handed to the engine."""
        if isinstance(prompt, str):
            generator.refuse_unfitting(len(prompt), field)  # before the tokenizer reads it
            ids = await asyncio.to_thread(generator.encode, prompt, not chat)
        else:
            vocab = generator.vocab_size
            if bad := [t for t in prompt if not 0 <= t < vocab]:
                raise RequestError(f"token id {bad[0]} is outside the vocabulary [0, {vocab})", param="prompt")
            ids = prompt
        wanted = generator.engine.check(len(ids), params.max_tokens)
        return generator.engine.submit(Job(ids, wanted, params.sampling, params.stop))

    # -- OpenAI ------------------------------------------------------------------------------------

    async def chat(self, request: Request) -> Response | Streaming:
        return await self._openai(request, chat=True)

    async def completions(self, request: Request) -> Response | Streaming:
        return await self._openai(request, chat=False)

    async def _openai(self, request: Request, chat: bool) -> Response | Streaming:
        try:
            body = _body(request)
            model, generator = self._generator(body.get("model"))
            defaults = generator.generation.defaults
            params = read_params(body, defaults)
            openai_api.refuse_unsupported(body)
            usage_asked = openai_api.include_usage(body)
            if chat:
                if generator.chat is None:
                    raise RequestError(
                        f"model {model.name!r} has no chat template in its artifact (its tokenizer had none when "
                        "it was imported or trained); send a prompt to /v1/completions instead",
                        param="model",
                    )
                messages, template = openai_api.messages(body), generator.chat
                # the contents alone past the bound: refused before the template renders them
                generator.refuse_unfitting(sum(len(m["content"]) for m in messages), "messages")
                prompt: str | list[int] = await asyncio.to_thread(template.render, messages)
            else:
                prompt = openai_api.prompt(body)
            sequence = await self._submit(generator, prompt, chat, params, "messages" if chat else "prompt")
        except RequestError as exc:
            return openai_api.error(exc)
        answer = Answer(chat, model.name)
        streaming = False
        try:
            if params.stream:
                first = await _first(request, sequence, generator)
                streaming = True
                return Streaming(self._openai_stream(sequence, first, answer, usage_asked), sequence.cancel)
            text, finish = await _watching(request, sequence, _text(sequence))
            use = openai_api.usage(len(sequence.job.prompt), sequence.generated)
            return json_response(answer.whole(text, _finished(finish, generator), use))
        except RequestError as exc:
            return openai_api.error(exc)
        finally:
            if not streaming:
                sequence.cancel()  # the handler ended early (refused, or its task cancelled): free the place
                _count(sequence)

    async def _openai_stream(
        self, sequence: Sequence, first: Event, answer: Answer, usage_asked: bool
    ) -> AsyncIterator[bytes]:
        try:
            if answer.chat:  # the assistant's role first, as OpenAI streams a chat
                yield event(answer.chunk(None, first=True))
            async for step in _steps(sequence, first):
                if step.finish == FinishReason.CANCELLED:
                    return
                if step.finish == FinishReason.ERROR:
                    yield event({"error": {"message": "generation failed on the server", "type": "server_error"}})
                    return
                if step.text or step.finish:
                    yield event(answer.chunk(step.text, step.finish))
            if usage_asked:
                yield event(answer.usage_chunk(openai_api.usage(len(sequence.job.prompt), sequence.generated)))
            yield DONE
        finally:
            sequence.cancel()
            _count(sequence)

    async def models(self, request: Request) -> Response:
        return json_response({"object": "list", "data": [self.model_object(n) for n in self.generation_models()]})

    def model_object(self, name: str) -> dict[str, Any]:
        """OpenAI's model object of a served model: what `/v1/models` lists, and what `GET /v1/models/{m}`
        (TF Serving's status route) adds for a text-generation model, so `client.models.retrieve` works."""
        model = self._repo().get(name, None)
        created = int(model.root.stat().st_mtime) if model.root.exists() else int(time.time())
        return {"id": name, "object": "model", "created": created, "owned_by": "pipe"}

    # -- Triton's generate extension ---------------------------------------------------------------

    async def generate(self, request: Request, stream: bool = False) -> Response | Streaming:
        body = _body(request)
        model, generator = self._generator(request.model_name, request.version, request.label)
        text = body.get("text_input")
        if not isinstance(text, str):
            raise RequestError(f"text_input must be a string, got {text!r:.60}")
        settings = body.get("parameters", {})
        if not isinstance(settings, dict):
            raise RequestError(f"parameters must be an object, got {settings!r:.60}")
        twice = next((k for k in TRITON_PARAMS if k in body and k in settings and body[k] != settings[k]), None)
        if twice is not None:  # which one was meant is not ours to guess
            raise RequestError(
                f"{twice} is given twice, {body[twice]!r:.40} at the top of the body and {settings[twice]!r:.40} "
                "under parameters; give it once",
                param=twice,
            )
        merged = {**{k: body[k] for k in TRITON_PARAMS if k in body}, **settings}
        if "stop_words" in merged and "stop" not in merged:  # TensorRT-LLM's name
            merged["stop"] = merged["stop_words"]
        params = read_params(merged, generator.generation.defaults)  # every given setting checked, stream too
        if stream:  # generate_stream streams whatever the body says
            params = dataclasses.replace(params, stream=True)
        sequence = await self._submit(generator, text, False, params, "text_input")
        head = {"model_name": model.name, "model_version": str(model.version)}
        if params.stream:
            try:
                first = await _first(request, sequence, generator)
            except BaseException:
                sequence.cancel()
                _count(sequence)
                raise
            return Streaming(self._triton_stream(sequence, first, head), sequence.cancel)
        try:
            answer, finish = await _watching(request, sequence, _text(sequence))
        finally:
            sequence.cancel()
            _count(sequence)
        return json_response(
            {
                **head,
                "text_output": answer,
                "finish_reason": _finished(finish, generator),
                "prompt_tokens": len(sequence.job.prompt),
                "completion_tokens": sequence.generated,
            }
        )

    async def generate_stream(self, request: Request) -> Response | Streaming:
        return await self.generate(request, stream=True)

    async def _triton_stream(self, sequence: Sequence, first: Event, head: dict[str, str]) -> AsyncIterator[bytes]:
        try:
            async for step in _steps(sequence, first):
                if step.finish == FinishReason.CANCELLED:
                    return
                if step.finish == FinishReason.ERROR:
                    yield event({"error": "generation failed on the server; the log has the traceback"})
                    return
                if step.text or step.finish:
                    answer = {**head, "text_output": step.text}
                    if step.finish is not None:
                        answer.update(finish_reason=step.finish, prompt_tokens=len(sequence.job.prompt),
                                      completion_tokens=sequence.generated)  # fmt: skip
                    yield event(answer)
                if step.finish is not None:
                    return
        finally:
            sequence.cancel()
            _count(sequence)
