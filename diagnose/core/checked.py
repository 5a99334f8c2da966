"""Dataclasses built from data read off disk or a socket, field by field checked
against their annotations, so that a string where a time belongs is refused
where it is read and never reaches the analysis as a TypeError.

Numbers must be finite (JSON allows Infinity and NaN); bool is no int. A
field that holds a dataclass is built from its dict the same way.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from functools import lru_cache


def checked(cls: type, data: object):
    """cls(**data) where every field of `data` fits its annotation; ValueError
    naming the first field that does not."""
    if not isinstance(data, dict):
        raise ValueError(f"{cls.__name__}: not an object")
    hints = _hints(cls)
    unknown = set(data) - set(hints)
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown field {sorted(map(str, unknown))[0]!r}")
    values = {}
    for name, value in data.items():
        try:
            values[name] = _value(value, hints[name])
        except ValueError as error:
            raise ValueError(f"{cls.__name__}.{name}: {error}") from None
    try:
        return cls(**values)
    except TypeError as error:          # a required field missing
        raise ValueError(f"{cls.__name__}: {error}") from None


@lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, object]:
    return typing.get_type_hints(cls)


def _value(value, hint):
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(hint):
            try:
                return _value(value, option)
            except ValueError:
                continue
        raise ValueError(f"{_short(value)} is none of {hint}")
    if origin is list:
        if not isinstance(value, list):
            raise ValueError(f"{_short(value)} is not a list")
        (item,) = typing.get_args(hint)
        return [_value(element, item) for element in value]
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{_short(value)} is not an object")
        key_hint, item = typing.get_args(hint)
        return {_value(key, key_hint): _value(element, item) for key, element in value.items()}
    return _plain(value, hint)


def _plain(value, hint):
    if hint is type(None):
        if value is not None:
            raise ValueError(f"{_short(value)} is not null")
        return None
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise ValueError(f"{_short(value)} is not a finite number")
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{_short(value)} is not a whole number")
        return value
    if hint in (str, bool):
        if not isinstance(value, hint):
            raise ValueError(f"{_short(value)} is not a {hint.__name__}")
        return value
    if hint is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{_short(value)} is not an object")
        return value
    if dataclasses.is_dataclass(hint):
        return checked(hint, value)
    raise ValueError(f"no check for {hint}")


def _short(value) -> str:
    text = type(value).__name__ if isinstance(value, (list, dict)) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
