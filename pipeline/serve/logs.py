"""The server's own log lines: text for a terminal, or one JSON object per line beside a JSON access log.

`--log-format json` (the default when `--access-log` is given, whose lines are JSON) writes each
line of pipe's and uvicorn's loggers as `{"time", "level", "logger", "message", "pid"}`, plus
`request_id` when the line was logged while answering a request and `exception` with the
traceback when there is one, so one log pipeline parses both streams.
"""

from __future__ import annotations

import datetime
import logging
import os
from typing import Any

import orjson

from pipeline.serve.request_id import current_id

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": os.getpid(),
        }
        if (request_id := current_id.get()) is not None:
            line["request_id"] = request_id
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line).decode()


def configure(level: str, log_format: str) -> None:
    """This process's root logger (pipe's lines), in `log_format` ("text" or "json")."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


def uvicorn_config(log_format: str) -> dict[str, Any] | None:
    """uvicorn's logging config for `log_format`: None keeps uvicorn's own (text)."""
    if log_format != "json":
        return None
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": f"{__name__}.JsonFormatter"}},
        "handlers": {"json": {"formatter": "json", "class": "logging.StreamHandler", "stream": "ext://sys.stderr"}},
        "loggers": {
            "uvicorn": {"handlers": ["json"], "level": "INFO", "propagate": False},
            "uvicorn.error": {"level": "INFO"},
        },
    }
