"""What a served text-generation version holds beside its session: the engine, the tokenizer and the
chat template (`TextGenerator`, `LoadedVersion.generator`), made from the artifact's manifest when the version
loads."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.artifact.generation import Generation
from pipeline.artifact.manifest import Manifest
from pipeline.core.errors import ArtifactError
from pipeline.serve.errors import RequestError
from pipeline.serve.generation.chat import ChatTemplate
from pipeline.serve.generation.engine import Engine
from pipeline.serve.generation.settings import GenerationSettings
from pipeline.serve.generation.stats import GenerationStats

if TYPE_CHECKING:
    from onnxruntime import InferenceSession
    from tokenizers import Tokenizer

# the server's settings, its compute pool and the version's metrics (None: none) -> the version's generator
Starter = Callable[[GenerationSettings, Executor | None, GenerationStats | None], "TextGenerator"]


@dataclass
class TextGenerator:
    """A text-generation version's engine, tokenizer and chat template (None: the model has none)."""

    engine: Engine
    tokenizer: Tokenizer
    chat: ChatTemplate | None
    generation: Generation
    vocab_size: int  # the model's rows of logits: a prompt's ids must be below it
    # the longest token's characters: a text of more than context x this many cannot fit the context, however it
    # tokenizes, and is refused unread (tokenizing 20 MB held the GIL for 20 s and kept 1.7 GB)
    longest_token: int = 1

    @classmethod
    def of(
        cls,
        root: Path,
        manifest: Manifest,
        session: InferenceSession,
        settings: GenerationSettings,
        executor: Executor | None,
        stats: GenerationStats | None = None,
    ) -> TextGenerator | None:
        """The generator of a text-generation version; None for any other task."""
        start = cls.prepare(root, manifest, session)
        return start(settings, executor, stats) if start is not None else None

    @classmethod
    def prepare(cls, root: Path, manifest: Manifest, session: InferenceSession) -> Starter | None:
        """What loads with the session (in the repository's worker thread: the tokenizer and the chat template,
        an ArtifactError refusing the version when either does not load), and starts the engine once the
        server's settings are at hand; None for a model of another task."""
        generation = manifest.generation
        if manifest.task != "text-generation" or generation is None:
            return None
        if manifest.tokenizer is None:
            raise ArtifactError("a text-generation model without its tokenizer cannot be served: re-import it")
        from tokenizers import Tokenizer

        try:
            tokenizer = Tokenizer.from_file(str(root / manifest.tokenizer.file))
        except Exception as exc:  # the tokenizers library raises a bare Exception for a bad file
            raise ArtifactError(f"tokenizer {manifest.tokenizer.file} does not load: {str(exc)[:200]}") from None
        tokenizer.no_truncation()
        tokenizer.no_padding()
        chat = None
        if generation.chat_template is not None:
            special = {}
            for key, token_id in (("bos_token", generation.bos_token_id), ("eos_token", generation.eos_token_ids[0])):
                if token_id is not None and (token := tokenizer.id_to_token(token_id)) is not None:
                    special[key] = token
            chat = ChatTemplate.load(root / generation.chat_template, special)
        record = generation
        limits = next((s.tokens for s in manifest.inputs if s.name == "input_ids" and s.tokens), None)
        vocab = limits.vocab_size if limits is not None and limits.vocab_size else tokenizer.get_vocab_size()
        longest = max((len(token) for token in tokenizer.get_vocab(with_added_tokens=True)), default=1)

        def start(
            settings: GenerationSettings, executor: Executor | None, stats: GenerationStats | None
        ) -> TextGenerator:
            engine = Engine(session, record, tokenizer, settings, executor, stats)
            return cls(engine, tokenizer, chat, record, vocab, longest)

        return start

    def refuse_unfitting(self, characters: int, field: str) -> None:
        """A 400 for a text of `characters` too long for the context whatever its tokens, before anything reads it
        (the tokenizer, the chat template): a token is at most `longest_token` characters (a byte-level token's
        characters are its bytes, and a character is a byte or more), so a text past context x that many cannot
        fit."""
        context = self.engine.context_length
        if context is None or characters <= context * self.longest_token:
            return
        raise RequestError(
            f"the prompt is {characters:,} characters; this model's context of {context:,} tokens holds at most "
            f"{context * self.longest_token:,} (its longest token is {self.longest_token} characters); shorten it",
            param=field,
        )

    def encode(self, text: str, special: bool) -> list[int]:
        """Token ids of a text: with the tokenizer's special tokens (a plain prompt), or as written (a prompt
        the chat template rendered: the template writes them)."""
        return list(self.tokenizer.encode(text, add_special_tokens=special).ids)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)
