"""One message for a field that does not validate, one rule for a registry's names."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import pytest
from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError, model_validator

from robo_pipe.errors import InputError
from robo_pipe.validation import first_error, one_of, read_mapping

REGISTRY = {"ppo": "a:A", "sac": "b:B"}


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")

    algo: Annotated[str, AfterValidator(one_of(REGISTRY, "RL algorithm"))] = "ppo"
    steps: int = 1
    table: dict[str, int] = {}

    @model_validator(mode="after")
    def _positive(self) -> Section:
        if self.steps < 0:
            raise ValueError("steps must not be negative")
        return self


def problem(data: dict[str, object]) -> str:
    with pytest.raises(ValidationError) as caught:
        Section.model_validate(data)
    return first_error("run.yaml", caught.value)


def test_a_name_outside_the_registry_lists_the_valid_ones_and_a_later_entry_counts() -> None:
    assert problem({"algo": "dqn"}) == (
        "run.yaml: field 'algo' = 'dqn': unknown RL algorithm; valid choices: ppo, sac"
    )
    REGISTRY["dqn"] = "c:C"
    try:
        assert Section(algo="dqn").algo == "dqn"
    finally:
        del REGISTRY["dqn"]


def test_the_message_names_the_file_the_field_and_the_value() -> None:
    assert problem({"steps": "many"}).startswith("run.yaml: field 'steps' = 'many': ")
    assert problem({"stepz": 1}) == "run.yaml: field 'stepz' = 1: Extra inputs are not permitted"
    assert problem({"steps": -1}) == "run.yaml: steps must not be negative"


def test_a_mapping_value_shows_its_first_four_entries() -> None:
    shown = problem({"steps": {f"k{i}": "x" for i in range(6)}})
    assert "'k3': 'x'}" in shown and "k4" not in shown


def test_a_file_that_is_missing_not_yaml_or_not_a_mapping_is_named(tmp_path: Path) -> None:
    file = tmp_path / "fleet.yaml"
    with pytest.raises(InputError, match=r"fleet\.yaml: no such fleet file"):
        read_mapping(file, "fleet file", InputError)
    file.write_text("devices: [")
    with pytest.raises(InputError, match=r"fleet\.yaml: not valid YAML"):
        read_mapping(file, "fleet file", InputError)
    file.write_text("- a\n- b\n")
    with pytest.raises(InputError, match=r"fleet\.yaml: expected a mapping of fields, got list"):
        read_mapping(file, "fleet file", InputError)
    file.write_text("devices: []\n")
    assert read_mapping(file, "fleet file", InputError) == {"devices": []}
