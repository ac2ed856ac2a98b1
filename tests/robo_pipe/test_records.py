"""The record kernel: a typed JSON round trip, and JSON that does not fit refused by name."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from robo_pipe.records import Record, RecordError


@dataclass(frozen=True)
class Row(Record):
    name: str
    ci95: tuple[float, float]


@dataclass(frozen=True)
class Report(Record):
    rows: list[Row]
    best: Row | None = None
    counts: dict[str, int] = field(default_factory=dict)
    seeds: tuple[int, ...] = ()


def test_nested_records_survive_json() -> None:
    report = Report([Row("a", (0.1, 0.9))], Row("b", (0.0, 1.0)), {"x": 3}, (1, 2, 3))
    assert Report.from_json(json.loads(json.dumps(report.to_json()))) == report
    assert Report.from_json({"rows": []}) == Report([]), "defaults fill missing optional fields"


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"rows": [{"name": "a", "ci95": [0.1]}]}, "Report.rows[0].ci95: expected 2 items"),
        ({"rows": [{"name": 3, "ci95": [0, 1]}]}, "Report.rows[0].name: expected str"),
        ({"rows": [], "counts": {"x": True}}, "Report.counts.x: expected int"),
        ({"rows": [], "extra": 1}, "Report: unknown fields extra"),
        ({}, "Report: missing field rows"),
        ({"rows": "nope"}, "Report.rows: expected a list"),
    ],
)
def test_json_that_does_not_fit_is_refused_by_name(data: dict[str, object], named: str) -> None:
    with pytest.raises(RecordError, match=named.replace("[", r"\[").replace("]", r"\]")):
        Report.from_json(data)
