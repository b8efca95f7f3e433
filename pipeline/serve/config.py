"""Server settings: one dataclass per component, gathered in `ServeConfig`.

Worker processes started by uvicorn rebuild the config from an environment variable holding its
JSON, so every worker serves the same repository with the same limits.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.serve.batching import BatchSettings
from pipeline.serve.generation.settings import GenerationSettings
from pipeline.serve.repository import RepositorySettings
from pipeline.serve.session import SessionOptions

CONFIG_ENV = "PIPE_SERVE_CONFIG"


@dataclass(frozen=True)
class HTTPSettings:
    """The HTTP layer: address, processes and request limits."""

    host: str = "127.0.0.1"  # loopback by default; binding elsewhere is an explicit choice
    port: int = 8000
    workers: int = 1  # server processes; each loads every model and batches on its own
    max_body_bytes: int = 64 * 1024 * 1024  # larger bodies get 413 before they are read
    api_key_env: str | None = None  # name of an env var holding a bearer token every request must carry
    graceful_s: float = 30.0  # after the drain, how long requests in flight may take to finish
    drain_s: float = 5.0  # on SIGTERM / Ctrl-C: seconds not ready but still answering, before stopping
    log_level: str = "info"
    log_format: str = "text"  # the server's own log lines: "text", or "json" (one object per line)
    access_log: str | None = None  # a file to append one JSON line per request to, or "-" for stdout
    read_timeout_s: float = 30.0  # a request's headers, and then its body, must arrive within this
    strict_readiness: bool = False  # ready only when every model found serves a version (Triton's default)


@dataclass(frozen=True)
class ServeConfig:
    """Everything `pipe serve` was asked for."""

    repository: RepositorySettings
    http: HTTPSettings = field(default_factory=HTTPSettings)
    session: SessionOptions = field(default_factory=SessionOptions)
    batching: BatchSettings = field(default_factory=BatchSettings)
    generation: GenerationSettings = field(default_factory=GenerationSettings)  # text-generation models

    def to_env(self) -> str:
        data = dataclasses.asdict(self)
        data["repository"]["paths"] = [str(p) for p in self.repository.paths]
        return json.dumps(data)

    @classmethod
    def from_env(cls) -> ServeConfig:
        data: dict[str, Any] = json.loads(os.environ[CONFIG_ENV])
        repo = data["repository"]
        return cls(
            repository=RepositorySettings(**{**repo, "paths": tuple(Path(p) for p in repo["paths"])}),
            http=HTTPSettings(**data["http"]),
            session=SessionOptions(**data["session"]),
            batching=BatchSettings(**data["batching"]),
            generation=GenerationSettings(**data["generation"]),
        )
