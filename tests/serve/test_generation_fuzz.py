"""The generation routes fuzzed with a language model served: schemathesis' requests reach the engine.

The OpenAPI document lists the served models as the OpenAI bodies' `model` (serve/openapi.py), so the
positive cases of /v1/chat/completions and /v1/completions, like Triton's generate, run real generations
of a real imported Llama with every sampling setting the schema allows (a max_tokens past the context,
top_k -1, seeds, stop strings, streamed or not), and the negative ones send what the schema forbids.
None may get a 5xx or an answer the document does not declare, and the server must stay up and quiet.
The tests after it pin what the runs found: nulls as OpenAI clients send them, a chat message without
content, a Triton setting given twice, generate_stream's own `stream` checked, and each streamed event as
the document states it; and an OpenAI feature pipe serve lacks (log probabilities, tools, JSON mode...) is
a 400 naming it, not an answer without it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.lm.imported_lm import imported_llama
from tests.serve.openapi_fuzz import fuzz
from tests.serve.serve_process import Server, start_server

pytestmark = pytest.mark.slow  # a few hundred generations

CONTEXT = 512  # test_generation.py's: the same cached import
NAME = "tiny-llama"
ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/generate", "/generate_stream")
CASES_PER_OPERATION = 40  # half positive, half negative


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("lm-fuzz")
    _, repository = imported_llama(base, CONTEXT)
    running = start_server([repository], base / "serve.log", "--poll", "0")
    yield running
    running.stop()


def test_generation_routes_fuzzed_find_no_server_error_and_no_schema_mismatch(server: Server) -> None:
    document = httpx.get(f"{server.url}/openapi.json").json()
    chat = document["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
    assert chat["schema"]["properties"]["model"]["enum"] == [NAME]

    result = fuzz(server.url, CASES_PER_OPERATION, paths=ROUTES)
    assert result.operations >= 5  # chat, completions, models, generate and generate_stream (by name and version)
    assert result.server_errors == []
    assert result.mismatches == []
    assert result.statuses[200] >= 20 and result.statuses[400] > 0  # real generations and real refusals
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200
    assert "Traceback" not in server.logs()


def _post(server: Server, path: str, body: dict[str, object]) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=60)


def test_openai_settings_sent_as_null_are_left_out(server: Server) -> None:
    nulls = dict.fromkeys(("n", "stream", "stream_options", "max_tokens", "temperature", "top_p", "top_k", "seed",
                           "stop"))  # fmt: skip
    chat = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], **nulls, "max_tokens": 3}
    answer = _post(server, "/v1/chat/completions", chat)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] <= 3
    completion = _post(server, "/v1/completions", {"model": NAME, "prompt": "hi", **nulls, "max_tokens": 2})
    assert completion.status_code == 200 and completion.json()["object"] == "text_completion"


def test_a_chat_message_without_content_is_refused(server: Server) -> None:
    chat = {"model": NAME, "messages": [{"role": "user", "content": "hi"}, {"role": "user"}], "max_tokens": 2}
    answer = _post(server, "/v1/chat/completions", chat)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "messages"
    assert "messages[1] must be an object with a string role and a content" in answer.json()["error"]["message"]


@pytest.mark.parametrize(
    ("asked", "why"),
    [({"logprobs": True}, "no log probabilities"), ({"top_logprobs": 3}, "no log probabilities"),
     ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "no tool calling"),
     ({"tool_choice": "required"}, "no tool calling"), ({"response_format": {"type": "json_object"}}, "JSON mode"),
     ({"logit_bias": {"5": 10}}, "no logit bias"), ({"best_of": 2}, "one answer per request")],
)  # fmt: skip
def test_an_openai_feature_pipe_lacks_is_refused_not_ignored(
    server: Server, asked: dict[str, object], why: str
) -> None:
    chat = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **asked}
    answer = _post(server, "/v1/chat/completions", chat)
    (key,) = asked
    assert answer.status_code == 400 and answer.json()["error"]["param"] == key
    assert why in answer.json()["error"]["message"] and f"leave {key} out" in answer.json()["error"]["message"]


def test_an_openai_feature_asked_off_is_served(server: Server) -> None:
    off = {"logprobs": False, "tools": [], "tool_choice": "none", "response_format": {"type": "text"}, "echo": False}
    chat = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **off}
    assert _post(server, "/v1/chat/completions", chat).status_code == 200
    completion = {"model": NAME, "prompt": "hi", "max_tokens": 2, "logprobs": 0, "best_of": 1, "suffix": None}
    assert _post(server, "/v1/completions", completion).status_code == 200


def test_a_triton_setting_given_twice_differently_is_refused(server: Server) -> None:
    twice = {"text_input": "hi", "max_tokens": -2, "parameters": {"max_tokens": 2, "temperature": 0}}
    answer = _post(server, f"/v2/models/{NAME}/generate", twice)
    assert answer.status_code == 400
    assert "max_tokens is given twice" in answer.json()["error"] and "give it once" in answer.json()["error"]
    same = {"text_input": "hi", "max_tokens": 2, "parameters": {"max_tokens": 2, "temperature": 0}}
    answer = _post(server, f"/v2/models/{NAME}/generate", same)
    assert answer.status_code == 200 and answer.json()["completion_tokens"] <= 2


def test_generate_stream_checks_the_stream_setting_it_overrides(server: Server) -> None:
    answer = _post(server, f"/v2/models/{NAME}/generate_stream", {"text_input": "hi", "stream": -2.5})
    assert answer.status_code == 400 and "stream must be true or false" in answer.json()["error"]
    streamed = _post(server, f"/v2/models/{NAME}/generate_stream",
                     {"text_input": "hi", "stream": False, "parameters": {"max_tokens": 2}})  # fmt: skip
    assert streamed.headers["content-type"].startswith("text/event-stream")  # the route streams whatever it says


def test_each_streamed_event_is_what_the_document_declares(server: Server) -> None:
    document = httpx.get(f"{server.url}/openapi.json").json()
    declared = document["paths"]["/v1/completions"]["post"]["responses"]["200"]["content"]["text/event-stream"]
    assert declared["schema"]["required"] == ["data"]  # one event, its data a JSON chunk or [DONE]
    body = {"model": NAME, "prompt": "hi", "max_tokens": 2, "stream": True}
    events = [e for e in _post(server, "/v1/completions", body).text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    assert all(json.loads(e.removeprefix("data: "))["object"] == "text_completion" for e in events[:-1])
