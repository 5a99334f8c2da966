"""core.checked: dataclasses built from untrusted JSON, field by field against their
annotations; what a field takes as it is skips its check, and nothing else does."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from diagnose.core.checked import checked, row_check

pytestmark = pytest.mark.unit


@dataclass
class Call:
    seq: int
    took: float
    name: str | None = None
    ranks: list[int] = field(default_factory=list)


@dataclass
class Rank:
    rank: int
    calls: list[Call] = field(default_factory=list)
    last: Call | None = None


def test_a_whole_object_is_built_with_its_nested_dataclasses():
    data = {"rank": 3, "calls": [{"seq": 1, "took": 2, "ranks": [0, 1]}],
            "last": {"seq": 1, "took": 0.5, "name": "all_reduce"}}
    built = checked(Rank, data)
    assert built == Rank(3, [Call(1, 2.0, None, [0, 1])], Call(1, 0.5, "all_reduce"))
    assert type(built.calls[0].took) is float                  # an int where a float goes
    assert data["calls"][0] == {"seq": 1, "took": 2, "ranks": [0, 1]}    # the input unchanged


@pytest.mark.parametrize("data, says", [
    ({"seq": 1, "took": 1.0, "extra": 1}, "Call: unknown field 'extra'"),
    ({"seq": 1, "took": float("inf")}, "Call.took: inf is not a finite number"),
    ({"seq": 1, "took": float("nan")}, "Call.took: nan is not a finite number"),
    ({"seq": True, "took": 1.0}, "Call.seq: True is not a whole number"),
    ({"seq": "1", "took": 1.0}, "Call.seq: '1' is not a whole number"),
    ({"seq": 1, "took": 1.0, "name": 5}, "Call.name: 5 is none of"),
    ({"seq": 1, "took": 1.0, "ranks": [0, "1"]}, "Call.ranks: '1' is not a whole number"),
    ({"seq": 1, "took": 1.0, "ranks": [0, True]}, "Call.ranks: True is not a whole number"),
    ({"seq": 1}, "Call: "),                                    # a required field missing
    ([1, 2.0], "Call: not an object"),
])
def test_a_field_that_does_not_fit_is_refused_by_name(data, says):
    with pytest.raises(ValueError) as refused:
        checked(Call, data)
    assert str(refused.value).startswith(says)


def test_a_nested_refusal_names_the_outer_field():
    with pytest.raises(ValueError, match=r"^Rank.calls: Call.took: inf is not a finite number"):
        checked(Rank, {"rank": 0, "calls": [{"seq": 1, "took": float("inf")}]})
    with pytest.raises(ValueError, match=r"^Rank.last: dict is none of "):
        checked(Rank, {"rank": 0, "last": {"seq": 1, "took": float("inf")}})


def test_a_row_is_checked_as_its_dict_would_be():
    row = [1, 2, "all_reduce", [0, 1]]
    built = row_check(Call)(row)
    assert built == checked(Call, {"seq": 1, "took": 2, "name": "all_reduce", "ranks": [0, 1]})
    assert type(built.took) is float and row == [1, 2, "all_reduce", [0, 1]]   # the row unchanged


@pytest.mark.parametrize("row, says", [
    ([1, float("inf"), None, []], "Call.took: inf is not a finite number"),
    ([True, 1.0, None, []], "Call.seq: True is not a whole number"),
    ([1, 1.0, None, [0, "1"]], "Call.ranks: '1' is not a whole number"),
    ([1, 1.0, None], "Call: not a row of its 4 fields' values"),     # each field, defaults too
    ({"seq": 1, "took": 1.0}, "Call: not a row of its 4 fields' values"),
])
def test_a_row_that_does_not_fit_is_refused_by_field(row, says):
    with pytest.raises(ValueError) as refused:
        row_check(Call)(row)
    assert str(refused.value).startswith(says)
