"""Dataclasses built from data read off disk or a socket, field by field checked
against their annotations, so that a string where a time belongs is refused
where it is read and never reaches the analysis as a TypeError.

Numbers must be finite (JSON allows Infinity and NaN); bool is no int. A
field that holds a dataclass is built from its dict the same way, one that
holds an enum from its value.

Each annotation is turned into a check function once (`_check_for`): a run dir
of 16,384 ranks checks 16,384 identities of one shape.
"""
from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from functools import lru_cache
from typing import Callable

Check = Callable[[object], object]


def checked(cls: type, data: object):
    """cls(**data) where every field of `data` fits its annotation; ValueError
    naming the first field that does not."""
    return _check_for(cls)(data)


@lru_cache(maxsize=None)
def field_checks(cls: type) -> dict[str, Check]:
    """The check of each field of the dataclass cls, by name: one field's new
    value checked alone, as `checked` checks it within the whole."""
    return {name: _check_for(hint) for name, hint in typing.get_type_hints(cls).items()}


@lru_cache(maxsize=None)
def _check_for(hint) -> Check:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        return _one_of(hint, [_check_for(option) for option in options if option is not type(None)],
                       type(None) in options)
    if origin is list:
        item = typing.get_args(hint)[0]
        return _list_of(_check_for(item), _taken_as_is(item) - {float})
    if origin is dict:
        key_hint, item_hint = typing.get_args(hint)
        return _dict_of(_check_for(key_hint), _check_for(item_hint))
    if dataclasses.is_dataclass(hint):
        return _dataclass(hint)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _member_of(hint)
    if hint in PLAIN:
        return PLAIN[hint]
    raise ValueError(f"no check for {hint}")


def _dataclass(cls: type) -> Check:
    checks: dict[str, Check] = {}      # filled on first use: a field may name its own class
    taken: dict[str, frozenset] = {}   # the types each field takes as they are

    def check(data):
        if not checks:
            checks.update(field_checks(cls))
            taken.update({name: _taken_as_is(hint)
                          for name, hint in typing.get_type_hints(cls).items()})
        if not isinstance(data, dict):
            raise ValueError(f"{cls.__name__}: not an object")
        unknown = data.keys() - checks.keys()
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown field {sorted(map(str, unknown))[0]!r}")
        values = {}
        for name, value in data.items():
            if type(value) in taken[name] and (type(value) is not float or math.isfinite(value)):
                values[name] = value
                continue
            try:
                values[name] = checks[name](value)
            except ValueError as error:
                raise ValueError(f"{cls.__name__}.{name}: {error}") from None
        try:
            return cls(**values)
        except TypeError as error:          # a required field missing
            raise ValueError(f"{cls.__name__}: {error}") from None
    return check


@lru_cache(maxsize=None)
def row_check(cls: type) -> Check:
    """The check of one row of the dataclass cls: a list of its fields' values in
    their order, each checked as `checked` checks it within a dict; the object."""
    names = tuple(field.name for field in dataclasses.fields(cls))
    hints = typing.get_type_hints(cls)
    taken = tuple(_taken_as_is(hints[name]) for name in names)
    checks = field_checks(cls)

    def check(row):
        if type(row) is not list or len(row) != len(names):
            raise ValueError(f"{cls.__name__}: not a row of its {len(names)} fields' values")
        values = row
        for index, value in enumerate(row):
            if type(value) in taken[index] and (type(value) is not float or math.isfinite(value)):
                continue
            if values is row:
                values = list(row)
            try:
                values[index] = checks[names[index]](value)
            except ValueError as error:
                raise ValueError(f"{cls.__name__}.{names[index]}: {error}") from None
        return cls(*values)
    return check


def _taken_as_is(hint) -> frozenset:
    """The exact types whose values a field of this hint holds unchanged (its
    check would return them as they are): the plain ones, and None where allowed."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return frozenset().union(*map(_taken_as_is, typing.get_args(hint)))
    return frozenset([hint]) if hint in (type(None), float, int, str, bool) else frozenset()


def _one_of(hint, options: list[Check], nullable: bool) -> Check:
    """The first option that takes the value; None at once where the hint allows
    it (most optional fields are null: no option's error is made for nothing)."""
    def check(value):
        if value is None and nullable:
            return None
        for option in options:
            try:
                return option(value)
            except ValueError:
                continue
        raise ValueError(f"{_short(value)} is none of {hint}")
    return check


def _list_of(item: Check, taken: frozenset = frozenset()) -> Check:
    """A list's check; one whose elements are all of types `taken` (its item's
    check would return them as they are) is copied whole, its types sorted in C."""
    def check(value):
        if not isinstance(value, list):
            raise ValueError(f"{_short(value)} is not a list")
        if taken and taken.issuperset(map(type, value)):
            return value.copy()
        return [item(element) for element in value]
    return check


def _dict_of(key: Check, item: Check) -> Check:
    def check(value):
        if not isinstance(value, dict):
            raise ValueError(f"{_short(value)} is not an object")
        return {key(name): item(element) for name, element in value.items()}
    return check


def _none(value):
    if value is not None:
        raise ValueError(f"{_short(value)} is not null")
    return None


def _float(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        raise ValueError(f"{_short(value)} is not a finite number")
    return float(value)


def _int(value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{_short(value)} is not a whole number")
    return value


def _member_of(kind: type[enum.Enum]) -> Check:
    def check(value):
        try:
            return kind(value)
        except (ValueError, TypeError):
            raise ValueError(f"{_short(value)} is no {kind.__name__}") from None
    return check


def _instance(kind: type, name: str) -> Check:
    def check(value):
        if not isinstance(value, kind):
            raise ValueError(f"{_short(value)} is not {name}")
        return value
    return check


PLAIN: dict[object, Check] = {
    type(None): _none, float: _float, int: _int,
    str: _instance(str, "a str"), bool: _instance(bool, "a bool"),
    dict: _instance(dict, "an object"),
}


def _short(value) -> str:
    text = type(value).__name__ if isinstance(value, (list, dict)) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
