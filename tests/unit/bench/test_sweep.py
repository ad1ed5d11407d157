from __future__ import annotations

import json
import math

import pytest

from ucmctl.bench.sweep import Point, parse_concurrencies, parse_rates, points
from ucmctl.core.errors import ExitStatus, UcmctlError


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("inf", [math.inf]),
        ("INF", [math.inf]),
        ("infinity", [math.inf]),
        ("1,2,4", [1.0, 2.0, 4.0]),
        ("0.5, inf", [0.5, math.inf]),
        (" 4 , 0.25 ,1e1 ", [4.0, 0.25, 10.0]),
        ("8", [8.0]),
    ],
)
def test_parse_rates(text: str, want: list[float]) -> None:
    assert parse_rates(text) == want


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("0", "'0' is not a request rate: it must be > 0"),
        ("1,-2", "'-2' is not a request rate: it must be > 0"),
        ("-inf", "'-inf' is not a request rate"),
        ("nan", "'nan' is not a request rate"),
        ("1,fast", "'fast' is not a request rate"),
        ("1,,2", "item 2 of '1,,2' is empty"),
        ("1,2,", "item 3 of '1,2,' is empty"),
        ("", "no value given"),
        (" ", "no value given"),
        ("1,2,1.0", "'1.0': rate 1 is given twice"),
        ("inf,Infinity", "rate inf is given twice"),
        ("1\n2", "is not a request rate"),
    ],
)
def test_parse_rates_rejects(text: str, says: str) -> None:
    with pytest.raises(UcmctlError) as caught:
        parse_rates(text)
    err = caught.value
    assert err.status == ExitStatus.BAD_INPUT == 2
    assert "\n" not in str(err)
    assert str(err).startswith("--request-rate: ")
    assert says in str(err)


@pytest.mark.parametrize(
    ("text", "want"),
    [("8", [8]), ("1,2,4,8", [1, 2, 4, 8]), (" 16, 4 ", [16, 4]), ("+3", [3])],
)
def test_parse_concurrencies(text: str, want: list[int]) -> None:
    assert parse_concurrencies(text) == want


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("0", "'0' is not a concurrency: it must be >= 1"),
        ("4,-1", "'-1' is not a concurrency: it must be >= 1"),
        ("2.5", "'2.5' is not a concurrency: it must be a whole number"),
        ("2.0", "'2.0' is not a concurrency: it must be a whole number"),
        ("inf", "'inf' is not a concurrency"),
        ("a", "'a' is not a concurrency"),
        ("1,,2", "item 2 of '1,,2' is empty"),
        ("", "no value given"),
        ("1,2,01", "'01': concurrency 1 is given twice"),
    ],
)
def test_parse_concurrencies_rejects(text: str, says: str) -> None:
    with pytest.raises(UcmctlError) as caught:
        parse_concurrencies(text)
    err = caught.value
    assert err.status == 2
    assert "\n" not in str(err)
    assert str(err).startswith("--concurrency: ")
    assert says in str(err)


def test_points_are_rate_major_in_the_order_given() -> None:
    got = points([4.0, 1.0, math.inf], [8, 2])
    assert [(p.request_rate, p.concurrency) for p in got] == [
        (4.0, 8),
        (4.0, 2),
        (1.0, 8),
        (1.0, 2),
        (math.inf, 8),
        (math.inf, 2),
    ]
    assert points(parse_rates("inf"), parse_concurrencies("128")) == [Point(math.inf, 128)]
    assert points([], [1]) == []


def test_labels() -> None:
    assert Point(math.inf, 8).label() == "rate inf, conc 8"
    assert Point(2.5, 8).label() == "rate 2.5/s, conc 8"
    assert Point(2.0, 1).label() == "rate 2/s, conc 1"
    assert Point(0.1, 16).label() == "rate 0.1/s, conc 16"
    labels = [p.label() for p in points(parse_rates("0.5,1,2,inf"), parse_concurrencies("1,8"))]
    assert len(set(labels)) == len(labels)  # a table row name: distinct points, distinct labels
    assert labels[0] == "rate 0.5/s, conc 1"


def test_as_dict_uses_vllm_keys_and_is_json() -> None:
    assert Point(math.inf, 8).as_dict() == {"request_rate": "inf", "max_concurrency": 8}
    assert Point(2.5, 4).as_dict() == {"request_rate": 2.5, "max_concurrency": 4}
    json.dumps(Point(math.inf, 8).as_dict(), allow_nan=False)  # no Infinity in the JSON


def test_point_is_frozen_and_hashable() -> None:
    p = Point(1.0, 2)
    with pytest.raises(AttributeError):
        p.concurrency = 3  # type: ignore[misc]
    assert len({p, Point(1.0, 2)}) == 1
