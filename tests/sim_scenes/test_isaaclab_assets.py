"""``robo-pipe assets build``: rp5's USD for Isaac Lab, converted from its MJCF and fixed.

Tests marked ``isaaclab`` run pxr, MuJoCo's converter and Newton in the Isaac Lab environment
(``make isaaclab-env``) as subprocesses and skip without it; with ``ROBO_PIPE_ISAACLAB_PYTHON``
set (``make test`` sets it) they fail instead. What they compare against is the MJCF as the
main environment's MuJoCo compiles it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import mujoco
import numpy as np
import pytest

from sim_scenes.isaaclab.assets import srgb_to_linear
from sim_scenes.isaaclab.env import ENV_VAR, IsaacLabMissingError, isaaclab_python
from tests.conftest import needs_isaaclab

ROOT = Path(__file__).resolve().parents[2]
MJCF = ROOT / "robots" / "rp5" / "rp5.xml"
COMMITTED = ROOT / "robots" / "rp5" / "usd"
"""The committed USD, which the tests only read."""


def in_isaaclab(code: str, *args: object) -> Any:
    """Run ``code`` in the Isaac Lab environment with the checkout importable; the JSON on its
    last stdout line (Warp prints its banner before)."""
    result = subprocess.run(
        [str(isaaclab_python()), "-c", code, *map(str, args)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def robo_pipe(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def files(folder: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.fixture(scope="module")
def mjcf_model() -> mujoco.MjModel:
    return mujoco.MjModel.from_xml_path(str(MJCF))


def names(model: mujoco.MjModel, kind: mujoco.mjtObj, count: int) -> list[str]:
    return [mujoco.mj_id2name(model, kind, i) for i in range(count)]


# --- no Isaac Lab needed -------------------------------------------------------------------


def test_srgb_to_linear_is_the_srgb_transfer_function() -> None:
    assert srgb_to_linear((0.0, 1.0, 0.5)) == pytest.approx((0.0, 1.0, 0.2140411))
    # The linear segment below 0.04045, and continuity where it meets the power curve.
    assert srgb_to_linear((0.02, 0.04045, 0.04046)) == pytest.approx(
        (0.02 / 12.92, 0.04045 / 12.92, 0.04045 / 12.92), rel=1e-3
    )


def test_isaaclab_python_names_the_make_target_when_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "nothing" / "python"))
    with pytest.raises(IsaacLabMissingError, match="make isaaclab-env"):
        isaaclab_python()
    python = tmp_path / "python"
    python.touch()
    monkeypatch.setenv(ENV_VAR, str(python))
    assert isaaclab_python() == python


def test_build_without_the_environment_is_a_user_error(tmp_path: Path) -> None:
    result = robo_pipe(
        "assets", "build", "--out", str(tmp_path / "usd"), env={ENV_VAR: str(tmp_path / "none")}
    )
    assert result.returncode == 2, result.stderr
    assert "make isaaclab-env" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "usd").exists()


# --- in the Isaac Lab environment ----------------------------------------------------------


@needs_isaaclab
def test_build_reproduces_the_committed_usd_byte_for_byte(tmp_path: Path) -> None:
    out = tmp_path / "usd"
    result = robo_pipe("assets", "build", "--robot", "rp5", "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout.splitlines()[-1])
    assert record["usd"] == str(out)
    assert sorted(record["files"]) == sorted(str(out / name) for name in files(out))
    built, committed = files(out), files(COMMITTED)
    assert built.keys() == committed.keys()
    for name in committed:
        assert built[name] == committed[name], f"{name} differs: rerun `robo-pipe assets build`"
    assert [p.name for p in tmp_path.iterdir()] == ["usd"]  # no temporary left beside it


@needs_isaaclab
def test_a_refused_build_leaves_the_previous_output(tmp_path: Path) -> None:
    out = tmp_path / "usd"
    out.mkdir()
    (out / "previous.usda").write_text("#usda 1.0\n")
    broken = tmp_path / "broken.xml"
    broken.write_text(MJCF.read_text().replace('range="0 0.03"', 'range="0 oops"', 1))
    result = subprocess.run(
        [str(isaaclab_python()), "-m", "sim_scenes.isaaclab.assets", str(broken), str(out)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr
    assert f"error: {broken}" in result.stderr
    assert files(out) == {"previous.usda": b"#usda 1.0\n"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.xml", "usd"]


CHECK_JOINTS = """
import json, sys
from pathlib import Path
from sim_scenes.isaaclab.assets import check_joints
print(json.dumps(check_joints(Path(sys.argv[1]), Path(sys.argv[2]))))
"""


@needs_isaaclab
def test_check_joints_finds_no_problem_in_the_committed_usd() -> None:
    assert in_isaaclab(CHECK_JOINTS, MJCF, COMMITTED / "rp5.usda") == []


# Each edit of Physics.usda (old text, which must occur once; new text) and what check_joints
# must then report.
BROKEN_JOINTS = {
    "limit": (
        "float physics:upperLimit = 108.861984",
        "float physics:upperLimit = 100",
        "joint 'shoulder_pitch': upper limit 100.0 deg, MuJoCo 108.862 deg",
    ),
    "axis": (  # finger_right's joint frame turned about x in the finger's frame only
        "quatf physics:localRot1 = (0, -1, 0, 0)",
        "quatf physics:localRot1 = (1, 0, 0, 0)",
        "joint 'finger_right': axis in body1 frame (0, 1, 0), MuJoCo (0, -1, 0)",
    ),
    "type": (
        'def PhysicsPrismaticJoint "finger_left"',
        'def PhysicsRevoluteJoint "finger_left"',
        "joint 'finger_left': MJCF slide, USD PhysicsRevoluteJoint",
    ),
    "anchor": (
        "point3f physics:localPos0 = (0, 0, 0.3)",
        "point3f physics:localPos0 = (0, 0, 0.31)",
        "joint 'elbow_pitch': anchor in body0 frame (0, 0, 0.31) m, MuJoCo (0, 0, 0.3) m",
    ),
    "limit softness": (  # base_yaw's, the first joint's, left out as the converter does
        "uniform double[] mjc:solreflimit = [0.02, 1]\n" + " " * 20 + "float",
        "float",
        "joint 'base_yaw': mjc:solreflimit not authored",
    ),
}


@needs_isaaclab
@pytest.mark.parametrize("broken", BROKEN_JOINTS)
def test_check_joints_finds_a_joint_that_differs_from_mujoco(tmp_path: Path, broken: str) -> None:
    old, new, expected = BROKEN_JOINTS[broken]
    usd = shutil.copytree(COMMITTED, tmp_path / "usd")
    physics = usd / "Payload" / "Physics.usda"
    text = physics.read_text()
    assert text.count(old) == 1, old
    physics.write_text(text.replace(old, new))
    problems = in_isaaclab(CHECK_JOINTS, MJCF, usd / "rp5.usda")
    assert len(problems) == 1, problems
    assert expected in problems[0]


DESCRIBE = """
import json, sys
import newton
from pxr import Usd, UsdGeom

stage = Usd.Stage.Open(sys.argv[1])
prims = []
for prim in stage.Traverse():
    colour = prim.GetAttribute("primvars:displayColor")
    prims.append({
        "name": prim.GetName(),
        "purpose": UsdGeom.Imageable(prim).ComputePurpose() if prim.IsA(UsdGeom.Imageable) else "",
        "schemas": list(prim.GetPrimTypeInfo().GetAppliedAPISchemas()),
        "attributes": [a.GetName() for a in prim.GetAuthoredAttributes()],
        "gravcomp": prim.GetAttribute("mjc:gravcomp").Get(),
        "colour": [list(c) for c in colour.Get()] if colour.HasAuthoredValue() else None,
    })

# What Isaac Lab's Newton backend makes of it: the shapes its renderer draws, with the colour
# it renders, the gravity compensation and joint limit softness its MuJoCo solver gets.
builder = newton.ModelBuilder()
newton.solvers.SolverMuJoCo.register_custom_attributes(builder)
builder.add_usd(stage)
shapes = [
    {"name": label.rsplit("/", 1)[-1], "colour": list(builder.shape_color[i])}
    for i, label in enumerate(builder.shape_label)
    if builder.shape_flags[i] & int(newton.ShapeFlags.VISIBLE)
]
gravcomp = builder.custom_attributes["mujoco:gravcomp"].values
model = builder.finalize(device="cpu")
solver = newton.solvers.SolverMuJoCo(model, use_mujoco_cpu=True)
print(json.dumps({
    "prims": prims,
    "shapes": shapes,
    "gravcomp": {builder.body_label[b].rsplit("/", 1)[-1]: float(v) for b, v in gravcomp.items()},
    "solreflimit": solver.mj_model.jnt_solref.tolist(),
}))
"""


@pytest.fixture(scope="module")
def committed() -> dict[str, Any]:
    """The committed USD as pxr composes it and as Newton loads it."""
    return in_isaaclab(DESCRIBE, COMMITTED / "rp5.usda")


@needs_isaaclab
def test_gravity_compensation_is_where_newton_reads_it(
    committed: dict[str, Any], mjcf_model: mujoco.MjModel
) -> None:
    bodies = names(mjcf_model, mujoco.mjtObj.mjOBJ_BODY, mjcf_model.nbody)
    expected = {b: float(g) for b, g in zip(bodies, mjcf_model.body_gravcomp, strict=True) if g}
    assert len(expected) == 7  # rp5's links; the base has none
    usd = {p["name"]: p["gravcomp"] for p in committed["prims"] if p["gravcomp"] is not None}
    assert usd == expected
    assert not any("mjc:body:gravcomp" in p["attributes"] for p in committed["prims"])
    assert committed["gravcomp"] == expected  # Newton's MuJoCo solver gets them


@needs_isaaclab
def test_colours_are_linear_and_render_as_the_mjcf_says(
    committed: dict[str, Any], mjcf_model: mujoco.MjModel
) -> None:
    geoms = names(mjcf_model, mujoco.mjtObj.mjOBJ_GEOM, mjcf_model.ngeom)
    rgb = {
        g: (float(c[0]), float(c[1]), float(c[2]))
        for g, c in zip(geoms, mjcf_model.geom_rgba, strict=True)
    }
    usd = {p["name"]: p["colour"] for p in committed["prims"] if p["colour"] is not None}
    assert usd.keys() == rgb.keys()
    for geom, colour in usd.items():
        assert colour == [pytest.approx(srgb_to_linear(rgb[geom]), abs=1e-6)], geom
    # Newton encodes USD's linear colour to display colour: the MJCF's rgba again.
    drawn = {s["name"]: s["colour"] for s in committed["shapes"]}
    assert drawn.keys() == rgb.keys()
    for geom, colour in drawn.items():
        assert colour == pytest.approx(rgb[geom], abs=1e-5), geom


@needs_isaaclab
def test_sites_and_guides_are_not_drawn(
    committed: dict[str, Any], mjcf_model: mujoco.MjModel
) -> None:
    site = mujoco.mj_id2name(mjcf_model, mujoco.mjtObj.mjOBJ_SITE, 0)
    assert site == "tcp"
    assert site not in {p["name"] for p in committed["prims"]}
    assert not any({"MjcSiteAPI", "NewtonSiteAPI"} & set(p["schemas"]) for p in committed["prims"])
    assert not [p["name"] for p in committed["prims"] if p["purpose"] == "guide"]
    # Newton's renderer draws exactly the MJCF's visible geoms (groups 0-2).
    geoms = names(mjcf_model, mujoco.mjtObj.mjOBJ_GEOM, mjcf_model.ngeom)
    visible = {g for g, group in zip(geoms, mjcf_model.geom_group, strict=True) if group <= 2}
    assert {s["name"] for s in committed["shapes"]} == visible


@needs_isaaclab
def test_joint_limits_are_as_stiff_as_mujocos(
    committed: dict[str, Any], mjcf_model: mujoco.MjModel
) -> None:
    np.testing.assert_allclose(committed["solreflimit"], mjcf_model.jnt_solref, rtol=1e-6)
