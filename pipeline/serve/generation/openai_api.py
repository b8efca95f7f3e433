"""The OpenAI API's shapes: a chat or completion request's prompt, and the answers, whole or as chunks.

Bodies follow the OpenAI API reference (and what the `openai` client reads): a chat completion is
`{"id": "chatcmpl-...", "object": "chat.completion", "created", "model", "choices": [{"index": 0,
"message": {"role": "assistant", "content"}, "finish_reason", "logprobs": null}], "usage"}`; streamed,
each `chat.completion.chunk` holds a `delta` (the role first, then content), the last one the
`finish_reason`, then a usage chunk when `stream_options.include_usage` asks, then `data: [DONE]`.
A text completion is `text_completion` with `choices[].text`. An error is `{"error": {"message",
"type", "param", "code"}}` with its HTTP status.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from pipeline.serve.errors import RequestError
from pipeline.serve.generation.sequence import FinishReason
from pipeline.serve.request_id import current_id
from pipeline.serve.responses import JSON_HEADERS, Response

_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 413: "invalid_request_error",
          429: "rate_limit_exceeded", 503: "server_error"}  # fmt: skip
MAX_MESSAGES = 1024
# OpenAI request fields pipe serve does not implement: the values that ask for nothing (served as if left out),
# and why any other is refused; a client asking for one gets a 400 naming it, never an answer without it
UNSUPPORTED: dict[str, tuple[tuple[Any, ...], str]] = {
    "logprobs": ((None, False, 0), "the answers carry no log probabilities"),
    "top_logprobs": ((None, 0), "the answers carry no log probabilities"),
    "logit_bias": ((None, {}), "it has no logit bias"),
    "tools": ((None, []), "it has no tool calling"),
    "tool_choice": ((None, "none", "auto"), "it has no tool calling"),
    "functions": ((None, []), "it has no function calling"),
    "function_call": ((None, "none", "auto"), "it has no function calling"),
    "response_format": ((None, {"type": "text"}), "it has no constrained output (JSON mode or a schema)"),
    "best_of": ((None, 1), "it makes one answer per request"),
    "echo": ((None, False), "its answers do not repeat the prompt"),
    "suffix": ((None, ""), "it does not insert text before a suffix"),
}


def error(exc: RequestError) -> Response:
    """A refusal in the OpenAI error shape (the request id beside it, as every pipe error carries)."""
    code = "model_not_found" if exc.status == 404 and exc.param == "model" else None
    detail = {"message": str(exc), "type": _TYPES.get(exc.status, "invalid_request_error"), "param": exc.param,
              "code": code}  # fmt: skip
    body: dict[str, Any] = {"error": detail}
    if (request_id := current_id.get()) is not None:
        body["request_id"] = request_id
    return exc.status, orjson.dumps(body), {**JSON_HEADERS, **exc.headers}


def _text(content: Any, where: str) -> str:
    """A message's content: a string, or a list of text parts (`{"type": "text", "text": ...}`)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
    ):
        return "".join(p["text"] for p in content)
    raise RequestError(
        f"{where}.content must be a string or a list of text parts ({{'type': 'text', 'text': ...}}), "
        f"got {content!r:.60}",
        param="messages",
    )


def refuse_unsupported(body: dict[str, Any]) -> None:
    """A 400 naming the first OpenAI feature the request asks for that pipe serve does not implement."""
    for key, (idle, why) in UNSUPPORTED.items():
        value = body.get(key)
        if not any(value == v and type(value) is type(v) for v in idle):
            raise RequestError(f"{key} {value!r:.40} is not supported: pipe serve {why}; leave {key} out", param=key)


def messages(body: dict[str, Any]) -> list[dict[str, str]]:
    """The chat's messages as the template reads them: role and content strings."""
    given = body.get("messages")
    if not isinstance(given, list) or not given or len(given) > MAX_MESSAGES:
        raise RequestError(
            f"messages must be a list of 1 to {MAX_MESSAGES} {{'role', 'content'}} objects, got {given!r:.60}",
            param="messages",
        )
    read = []
    for i, message in enumerate(given):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or "content" not in message:
            raise RequestError(f"messages[{i}] must be an object with a string role and a content, got "
                               f"{message!r:.60}", param="messages")  # fmt: skip
        read.append({"role": message["role"], "content": _text(message["content"], f"messages[{i}]")})
    return read


def prompt(body: dict[str, Any]) -> str | list[int]:
    """A completion's prompt: a string or token ids (one of each kind in a list of one: n is 1)."""
    given = body.get("prompt")
    if isinstance(given, list) and len(given) == 1 and isinstance(given[0], (str, list)):
        given = given[0]
    if isinstance(given, str):
        return given
    if isinstance(given, list) and given and all(isinstance(t, int) and not isinstance(t, bool) for t in given):
        return given
    raise RequestError(
        f"prompt must be a string or a list of token ids (one prompt per request), got {given!r:.60}", param="prompt"
    )


def include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise RequestError(f"stream_options must be {{'include_usage': true|false}}, got {options!r:.60}",
                           param="stream_options")  # fmt: skip
    return bool(options.get("include_usage", False))


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}  # fmt: skip


class Answer:
    """The answers of one request: its id, creation time and model."""

    def __init__(self, chat: bool, model: str) -> None:
        self.chat = chat
        self.model = model
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{current_id.get() or time.time_ns()}"
        self.created = int(time.time())

    def _wrap(self, choice: dict[str, Any], chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion" if self.chat else "text_completion") + (".chunk" if chunk and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": [choice]}

    def whole(self, text: str, finish: FinishReason, use: dict[str, int]) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        choice.update({"message": {"role": "assistant", "content": text}} if self.chat else {"text": text})
        return {**self._wrap(choice, chunk=False), "usage": use}

    def chunk(self, text: str | None, finish: FinishReason | None = None, first: bool = False) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        return self._wrap(choice, chunk=True)

    def usage_chunk(self, use: dict[str, int]) -> dict[str, Any]:
        return {**self._wrap({}, chunk=True), "choices": [], "usage": use}
