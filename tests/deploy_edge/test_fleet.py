"""The fleet file and the rollout planner (no devices): validation that names file, field and
value; label selection; the canary and the waves; the abort threshold."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy_edge.fleet import (
    FleetDevice,
    FleetError,
    RolloutPolicy,
    load_fleet,
    plan_waves,
    select,
    wave_failed,
    wave_size,
)
from robo_pipe.errors import RoboPipeError


def devices(n: int, **labels: str) -> list[FleetDevice]:
    return [
        FleetDevice(
            name=f"arm-{i:02d}",
            url=f"http://127.0.0.1:{9000 + i}",
            token_env="ARM_TOKEN",
            labels={"site": "lab" if i % 2 == 0 else "plant", **labels},
        )
        for i in range(n)
    ]


def names(waves: list[list[FleetDevice]]) -> list[list[str]]:
    return [[d.name for d in wave] for wave in waves]


def write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


FLEET = {
    "devices": [
        {
            "name": "lab-arm-01",
            "url": "https://lab-arm-01.local:8765",
            "token_env": "LAB_TOKEN",
            "target": "jetson-orin-nano",
            "ca_cert": "certs/lab-ca.pem",
            "labels": {"site": "lab", "robot": "rp5", "rack": 3},
        },
        {"name": "plant-arm-07", "url": "http://10.0.0.7:8765", "token_env": "PLANT_TOKEN"},
    ],
    "rollout": {"canary": 1, "waves": [2, "50%"], "max_failures": 1, "pause_s": 5},
}


def test_a_fleet_file_loads_with_its_labels_policy_and_relative_paths(tmp_path: Path) -> None:
    fleet = load_fleet(write(tmp_path, FLEET))
    first, second = fleet.devices
    assert first.labels == {"site": "lab", "robot": "rp5", "rack": "3"}, "numbers become text"
    assert first.ca_cert == tmp_path.resolve() / "certs" / "lab-ca.pem"
    assert second.target == "local-cpu" and second.labels == {}
    assert fleet.rollout.waves == [2, "50%"] and fleet.rollout.max_failures == 1
    assert fleet.rollout.pause_s == 5 and fleet.rollout.device_timeout_s > 0
    minimal = load_fleet(write(tmp_path, {"devices": FLEET["devices"]}))
    assert minimal.rollout == RolloutPolicy() and minimal.rollout.canary == 1


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"rollout": {"canary": -1}}, "field 'rollout.canary' = -1"),
        ({"rollout": {"waves": ["50"]}}, "field 'rollout.waves' = ['50']"),
        ({"rollout": {"waves": ["150%"]}}, "'150%'"),
        ({"rollout": {"waves": [0]}}, "at least one device"),
        ({"rollout": {"max_failure_pct": 120}}, "field 'rollout.max_failure_pct' = 120"),
        ({"rollout": {"max_failures": -2}}, "field 'rollout.max_failures' = -2"),
        ({"rollout": {"canery": 1}}, "field 'rollout.canery' = 1"),
        ({"devices": []}, "field 'devices' = []"),
        ({"devices": [{"name": "a", "url": "ftp://x", "token_env": "T"}]}, "devices.0.url"),
        ({"devices": [{"name": "a b", "url": "http://x", "token_env": "T"}]}, "'a b'"),
        ({"devices": [{"name": "a", "url": "http://x"}]}, "missing field 'devices.0.token_env'"),
        (
            {"devices": [{"name": "a", "url": "http://x", "token_env": "T", "labels": ["lab"]}]},
            "devices.0.labels",
        ),
        (
            {"devices": [{"name": "a", "url": "http://x", "token_env": "T"}] * 2},
            "device name 'a' appears twice",
        ),
    ],
)
def test_an_invalid_fleet_file_names_file_field_and_value(
    tmp_path: Path, change: dict[str, Any], expected: str
) -> None:
    path = write(tmp_path, {**FLEET, **change})
    with pytest.raises(FleetError) as caught:
        load_fleet(path)
    assert str(path) in str(caught.value) and expected in str(caught.value), caught.value
    assert isinstance(caught.value, RoboPipeError)


def test_a_missing_or_malformed_fleet_file_is_a_named_error(tmp_path: Path) -> None:
    with pytest.raises(FleetError, match="no such fleet file"):
        load_fleet(tmp_path / "nope.yaml")
    with pytest.raises(FleetError, match="not valid YAML"):
        load_fleet(write(tmp_path, "devices: [unclosed"))
    with pytest.raises(FleetError, match="expected a mapping"):
        load_fleet(write(tmp_path, "- just\n- a list\n"))


def test_select_keeps_file_order_and_every_selector_must_match() -> None:
    fleet = devices(5, robot="rp5")
    assert [d.name for d in select(fleet, [])] == [d.name for d in fleet]
    assert [d.name for d in select(fleet, ["site=lab"])] == ["arm-00", "arm-02", "arm-04"]
    assert [d.name for d in select(fleet, ["site=lab", "name=arm-02"])] == ["arm-02"]
    assert len(select(fleet, [" robot = rp5 "])) == 5
    with pytest.raises(FleetError, match=r"no device matches; labels: .*site=lab"):
        select(fleet, ["site=moon"])
    with pytest.raises(FleetError, match="expected label=value"):
        select(fleet, ["site"])


def test_the_canary_comes_first_then_the_waves_and_the_rest_joins_the_last() -> None:
    fleet = devices(10)
    policy = RolloutPolicy(canary=1, waves=[2, 3])
    assert names(plan_waves(fleet, policy)) == [
        ["arm-00"],
        ["arm-01", "arm-02"],
        ["arm-03", "arm-04", "arm-05", "arm-06", "arm-07", "arm-08", "arm-09"],
    ]
    assert names(plan_waves(fleet, RolloutPolicy(canary=2))) == [
        ["arm-00", "arm-01"],
        [f"arm-{i:02d}" for i in range(2, 10)],
    ]
    no_canary = plan_waves(fleet, RolloutPolicy(canary=1, waves=[5, 2]), canary_override=0)
    assert [len(w) for w in no_canary] == [5, 5], "--canary 0: no canary wave"
    one_wave = plan_waves(fleet, RolloutPolicy(canary=1, waves=[4]))
    assert [len(w) for w in one_wave] == [1, 9], "the rest joins the only wave"
    short = plan_waves(devices(3), RolloutPolicy(canary=1, waves=[4, 4]))
    assert [len(w) for w in short] == [1, 2], "no empty waves"
    everything = plan_waves(devices(2), RolloutPolicy(canary=5))
    assert names(everything) == [["arm-00", "arm-01"]]


def test_percent_waves_are_shares_of_the_selected_devices_rounded_up() -> None:
    assert wave_size("25%", 10) == 3 and wave_size("10%", 10) == 1 and wave_size("1%", 10) == 1
    assert wave_size("100%", 7) == 7 and wave_size(4, 7) == 4 and wave_size("20%", 5) == 1
    waves = plan_waves(devices(20), RolloutPolicy(canary=1, waves=["10%", "50%"]))
    assert [len(w) for w in waves] == [1, 2, 17], "2 (10% of 20), then 10 and the 7 left"
    for n in range(1, 12):  # every device exactly once, in order
        flat = [d for wave in plan_waves(devices(n), RolloutPolicy(waves=["30%", 1])) for d in wave]
        assert [d.name for d in flat] == [d.name for d in devices(n)]
    with pytest.raises(FleetError, match="--canary -1"):
        plan_waves(devices(3), RolloutPolicy(), canary_override=-1)


def test_the_abort_threshold() -> None:
    strict = RolloutPolicy()
    assert not wave_failed(0, 5, strict) and wave_failed(1, 5, strict), "no rule: any failure"
    counted = RolloutPolicy(max_failures=1)
    assert not wave_failed(1, 5, counted) and wave_failed(2, 5, counted)
    assert wave_failed(1, 5, counted, max_failures_override=0), "--max-failures wins"
    assert not wave_failed(2, 5, strict, max_failures_override=2)
    share = RolloutPolicy(max_failure_pct=20)
    assert not wave_failed(1, 5, share) and wave_failed(2, 5, share) and wave_failed(1, 4, share)
    both = RolloutPolicy(max_failures=3, max_failure_pct=50)
    assert wave_failed(3, 4, both) and not wave_failed(3, 10, both) and wave_failed(4, 10, both)
    assert wave_failed(1, 1, counted, max_failures_override=5, canary=True), "canary: any"
    assert not wave_failed(0, 1, counted, canary=True)
