"""Dataclasses as rows (their fields' values in order, a nested dataclass or a list
of them as rows too) and back: how a worker process sends objects it has checked
to the process that asked for them, as plain data (core/workers.py). `built`
checks nothing: it takes only rows that `as_row` made."""
from __future__ import annotations

import dataclasses
import types
import typing
from functools import lru_cache, partial
from itertools import starmap
from operator import attrgetter

ONE, MANY = "one", "many"       # a field holding a dataclass (or None), a list of them


def as_row(obj) -> list:
    values, nested = _values(type(obj))(obj), _nested(type(obj))
    if not any(nested):
        return list(values)
    return [value if how is None or value is None
            else as_row(value) if how[0] == ONE else [as_row(item) for item in value]
            for value, how in zip(values, nested)]


def built(cls: type, row: list):
    makers = _makers(cls)
    if makers is None:
        return cls(*row)
    return cls(*[value if make is None or value is None else make(value)
                 for value, make in zip(row, makers)])


def built_list(cls: type, rows: list) -> list:
    """`built` of each row; a class of plain fields only is built in C (starmap)."""
    if _makers(cls) is None:
        return list(starmap(cls, rows))
    return [built(cls, row) for row in rows]


@lru_cache(maxsize=None)
def _makers(cls: type) -> tuple | None:
    """Per field, what builds its value from its row (None: the value itself);
    None for a class of plain fields only."""
    if not any(_nested(cls)):
        return None
    makers = []
    for how in _nested(cls):
        if how is None:
            makers.append(None)
        elif how[0] == ONE:
            makers.append(partial(built, how[1]))
        else:
            makers.append(partial(built_list, how[1]))
    return tuple(makers)


@lru_cache(maxsize=None)
def _values(cls: type):
    names = [field.name for field in dataclasses.fields(cls)]
    get = attrgetter(*names)
    return get if len(names) > 1 else lambda obj: (get(obj),)


@lru_cache(maxsize=None)
def _nested(cls: type) -> tuple:
    """Per field: None for a plain value, (ONE or MANY, the dataclass) otherwise."""
    hints = typing.get_type_hints(cls)
    return tuple(_how(hints[field.name]) for field in dataclasses.fields(cls))


def _how(hint) -> tuple[str, type] | None:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = [option for option in typing.get_args(hint) if option is not type(None)]
        hint = options[0] if len(options) == 1 else hint
    if dataclasses.is_dataclass(hint):
        return ONE, hint
    if typing.get_origin(hint) is list and dataclasses.is_dataclass(typing.get_args(hint)[0]):
        return MANY, typing.get_args(hint)[0]
    return None
