"""The stage records survive a JSON round trip (resume files, ``--json`` output, flow results)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from robo_pipe.records import Record
from stages.dataset.layout import DatasetRef
from stages.evaluate.comparison import compare_outcomes
from stages.evaluate.report import EvalReport, VariantRow
from stages.evaluate.sequential import plan_looks
from stages.policy.checkpoint import CheckpointRef
from stages.policy.types import BaseRef

BASE = BaseRef("checkpoint", "/ckpt/base/step-0000100", "ab" * 32)
ROW = VariantRow("touch-cubes", 10, 7, 0.7, (0.397, 0.892), 31.5)
COMPARISON = compare_outcomes(
    {("touch-cubes", 0): True, ("touch-cubes", 1): False},
    {("touch-cubes", 0): False, ("touch-cubes", 1): False},
    plan_looks(2, 1, 0.05, 0.2, 0.05, 0.0, "pocock"),
    0,
    ("not worse", "reached the maximum", 0.05),
    "/ckpt/champion",
)
REPORT = EvalReport(
    policy="/ckpt/policy/step-0000200",
    episodes=20,
    successes=13,
    success_rate=0.65,
    ci95=(0.43, 0.82),
    rows=[ROW, VariantRow("touch-spheres", 10, 6, 0.6, (0.31, 0.83), 33.0)],
    env_steps_per_s=812.5,
    episodes_per_s=25.0,
    wall_s=3.25,
    startup_s=1.5,
    time_share={"simulate": 0.5, "render": 0.3, "inference": 0.2},
    workers=2,
    replacements=1,
    seed=0,
    seeds=[11, 22, 33],
    outcomes=[{"variant": "touch-cubes", "index": 0, "seed": 11, "success": True}],
    recordings=["/runs/x/touch-cubes-0000-success.png"],
    comparison=COMPARISON,
    report="/runs/x/report.md",
    plot="/runs/x/success.png",
)
RECORDS: list[Record] = [
    DatasetRef(
        path="/data/demo",
        content_hash="cd" * 32,
        episodes=12,
        frames=600,
        fps=20.0,
        robot="rp5",
        variant="touch-mixed",
        features={"action": {"dtype": "float32", "shape": [6]}},
        source="scripted",
        source_success_rate=0.92,
    ),
    BASE,
    CheckpointRef(
        path="/ckpt/policy/step-0000200",
        content_hash="ef" * 32,
        policy_type="default",
        trainable="lora",
        step=200,
        trainable_params=1000,
        total_params=50_000,
        base=BASE,
        dataset_hashes=["cd" * 32],
        config_hash="0123456789ab",
        code_version="git:abc",
        metrics={"loss": 0.25},
    ),
    CheckpointRef("/ckpt/base", "12" * 32, "default", "all", 100, 5, 5),
    ROW,
    COMPARISON,
    REPORT,
    replace(REPORT, comparison=None),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_a_record_round_trips_through_json(record: Record) -> None:
    data: Any = json.loads(json.dumps(record.to_json()))
    assert type(record).from_json(data) == record
