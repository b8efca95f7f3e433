"""The artifact's chat template, rendered as transformers renders it: Jinja in a sandbox.

transformers' `apply_chat_template` compiles the template in jinja2's `ImmutableSandboxedEnvironment`
with `trim_blocks` and `lstrip_blocks`, gives it `messages`, `add_generation_prompt` and the tokenizer's
special tokens (`bos_token`, `eos_token`), and a `raise_exception` function; the rendered text is then
tokenized without adding special tokens (the template writes them). The same here, so a chat request
is the prompt the model was trained on. A template that raises or fails on a request's messages is
a 400 naming the error, never a 500.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core.errors import ArtifactError
from pipeline.serve.errors import RequestError


class ChatTemplate:
    """A compiled chat template and the special tokens it may name."""

    def __init__(self, text: str, special: dict[str, str]) -> None:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise RequestError(f"the model's chat template refused the messages: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        try:
            self._template = env.from_string(text)
        except jinja2.TemplateError as exc:
            raise ArtifactError(f"the chat template does not compile: {exc}") from None
        self._special = special

    @classmethod
    def load(cls, path: Path, special: dict[str, str]) -> ChatTemplate:
        return cls(path.read_text(encoding="utf-8"), special)

    def render(self, messages: list[dict[str, str]]) -> str:
        import jinja2

        try:
            return self._template.render(messages=messages, add_generation_prompt=True, **self._special)
        except RequestError:
            raise
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError) as exc:
            raise RequestError(f"the model's chat template failed on these messages: {exc}") from None
