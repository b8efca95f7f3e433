"""Typed JSON: build dataclasses from parsed JSON, checking every nested field against its annotation.

A manifest is edited by hand, copied between machines and read by a server: every value in it is
checked before any reader indexes it. `decode` walks a dataclass's annotations (str, int, float,
bool, None, unions, Literal, list[X], dict[str, X], nested dataclasses, Any) and collects every
problem with its dotted path (`inputs[0].shape[1]: expected an integer or a string, got 1.5`);
a field may add its own check through its metadata (`check`: value -> problem or None) and be
spelled differently in JSON (`json`: "import" for the `import_` field). `encode` is the inverse.
Standard library only: the server and the CLI import this cheaply.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable
from typing import Any, Literal

Check = Callable[[Any], str | None]


def json_name(f: dataclasses.Field) -> str:
    """The key a dataclass field has in JSON (its name unless metadata says otherwise)."""
    return f.metadata.get("json", f.name)


def decode(cls: type, data: Any, where: str = "") -> Any:
    """An instance of dataclass `cls` from JSON data; raises ValueError listing every problem found."""
    problems: list[str] = []
    value = _value(cls, data, where, problems)
    if problems:
        raise ValueError("; ".join(problems[:8]) + (f"; and {len(problems) - 8} more" if len(problems) > 8 else ""))
    return value


def encode(obj: Any) -> Any:
    """JSON-able data from a dataclass instance (fields under their JSON names; None stages omitted)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if value is None and f.metadata.get("omit_none"):
                continue
            out[json_name(f)] = encode(value)
        return out
    if isinstance(obj, dict):
        return {k: encode(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [encode(v) for v in obj]
    return obj


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _dataclass(cls: type, data: Any, where: str, problems: list[str]) -> Any:
    if not isinstance(data, dict):
        problems.append(f"{where or 'top level'}: expected an object, got {_show(data)}")
        return None
    fields = dataclasses.fields(cls)
    by_json = {json_name(f): f for f in fields}
    unknown = sorted(k for k in data if k not in by_json)
    missing = sorted(
        json_name(f)
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and json_name(f) not in data
    )
    prefix = f"{where}: " if where else ""
    if unknown:
        problems.append(f"{prefix}unknown key(s) {[str(k)[:40] for k in unknown[:5]]}")
    if missing:
        problems.append(f"{prefix}missing key(s) {missing}")
    if unknown or missing:
        return None
    hints = _hints(cls)
    kwargs = {}
    before = len(problems)
    for key, f in by_json.items():
        if key not in data:
            continue
        path = f"{where}.{key}" if where else key
        value = _value(hints[f.name], data[key], path, problems)
        check: Check | None = f.metadata.get("check")
        if check is not None and len(problems) == before and (problem := check(value)):
            problems.append(f"{path}: {problem}")
        kwargs[f.name] = value
    return cls(**kwargs) if len(problems) == before else None


def _value(kind: Any, data: Any, where: str, problems: list[str]) -> Any:
    if kind is Any:
        return data
    if dataclasses.is_dataclass(kind):
        return _dataclass(kind, data, where, problems)
    origin = typing.get_origin(kind)
    if origin in (types.UnionType, typing.Union):
        options = typing.get_args(kind)
        if data is not None and type(None) in options and len(options) == 2:
            # `X | None` given a value: it is an X, so X's own problems say which nested field is wrong
            (option,) = (o for o in options if o is not type(None))
            return _value(option, data, where, problems)
        for option in options:
            trial: list[str] = []
            value = _value(option, data, where, trial)
            if not trial:
                return value
        problems.append(f"{where}: expected {_describe(kind)}, got {_show(data)}")
        return None
    if origin is Literal:
        allowed = typing.get_args(kind)
        if data not in allowed or isinstance(data, bool) != any(isinstance(a, bool) for a in allowed):
            problems.append(f"{where}: expected one of {list(allowed)}, got {_show(data)}")
        return data
    if origin is list:
        if not isinstance(data, list):
            problems.append(f"{where}: expected a list, got {_show(data)}")
            return None
        (item,) = typing.get_args(kind)
        return [_value(item, v, f"{where}[{i}]", problems) for i, v in enumerate(data)]
    if origin is dict:
        if not isinstance(data, dict):
            problems.append(f"{where}: expected an object, got {_show(data)}")
            return None
        _, item = typing.get_args(kind)
        return {k: _value(item, v, f"{where}.{k}", problems) for k, v in data.items()}
    if not _scalar_ok(kind, data):
        problems.append(f"{where}: expected {_describe(kind)}, got {_show(data)}")
    elif kind is float and not _finite(data):
        # Python's json reads NaN and Infinity; a NaN metric compares false with every bound and so passes them
        problems.append(f"{where}: expected a finite number, got {_show(data)}")
    return data


def _scalar_ok(kind: Any, data: Any) -> bool:
    if kind is type(None):
        return data is None
    if kind is bool:
        return isinstance(data, bool)
    if kind is int:
        return isinstance(data, int) and not isinstance(data, bool)
    if kind is float:
        return isinstance(data, int | float) and not isinstance(data, bool)
    if kind is str:
        return isinstance(data, str)
    raise TypeError(f"jsontypes cannot check annotation {kind!r}")  # a programming error, not bad input


def _finite(number: int | float) -> bool:
    try:
        return math.isfinite(number)
    except OverflowError:  # an integer beyond any float
        return False


def _describe(kind: Any) -> str:
    if typing.get_origin(kind) in (types.UnionType, typing.Union):
        return " or ".join(_describe(k) for k in typing.get_args(kind))
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false", type(None): "null"}
    if kind in names:
        return names[kind]
    origin = typing.get_origin(kind)
    return {list: "a list", dict: "an object"}.get(origin, "an object")


def _show(data: Any) -> str:
    """A short rendering of a bad value: a 5,000-digit number or a deep list must not flood the message."""
    if isinstance(data, dict | list):
        return type(data).__name__ if len(repr(data)) > 60 else repr(data)
    if isinstance(data, int) and not isinstance(data, bool) and abs(data) > 10**18:
        return "an integer too large to be meant"
    text = repr(data)
    return text if len(text) <= 60 else text[:57] + "..."
