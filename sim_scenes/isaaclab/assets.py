"""A robot's USD for Isaac Lab, generated from its MJCF (``robo-pipe assets build``).

Isaac Lab loads a robot as USD; ours are authored in MJCF (``robots/<robot>/<robot>.xml``) and
converted by ``mujoco_usd_converter`` 0.6.1, whose output is byte-identical between runs.
Four things in that output are wrong for Isaac Lab 3's Newton backend and are fixed in the
converted layers, so that the USD behaves and looks as the MJCF does in MuJoCo:

1. Gravity compensation is written as ``mjc:body:gravcomp``; Newton's MuJoCo solver reads
   ``mjc:gravcomp``. Without it the arm sags (rp5's links carry ``gravcomp="1"``).
2. MJCF ``rgba`` is a display (sRGB-encoded) colour, copied unchanged into
   ``primvars:displayColor``, which USD defines as linear: Newton encodes it to sRGB again
   when it loads it, and every part rendered lighter than in MuJoCo. It is linearized
   (:func:`srgb_to_linear`); opacity is not gamma-encoded and stays as it is.
3. Sites (rp5's ``tcp``) become ``guide`` spheres carrying ``MjcSiteAPI``. Newton's importer
   makes every site a visible shape whatever its purpose or visibility, so camera images
   showed the (in MuJoCo invisible) orange tool marker; sites are removed. Isaac Lab tasks
   take the tool point from the MJCF. Other ``guide`` prims (geoms of MJCF groups 3 to 5,
   e.g. collision-only ones) are kept: Newton does not draw them, and they collide.
4. A joint limit's softness (``mjc:solreflimit``) is left out when it equals the schema's
   fallback (MuJoCo's default, (0.02, 1)), and Newton reads a missing one as "use Newton's
   own limit gains" (1e4, 10): for rp5 those became solref (0.2 to 0.75 s, damping ratio
   0.03 to 0.08), limits that bounce where MuJoCo's are critically damped. It is authored.

Then every MJCF joint is checked against its USD joint (:func:`check_joints`); a build whose
joints disagree with MuJoCo's is refused and leaves the previous output in place.

Runs in the Isaac Lab environment (``make isaaclab-env``: pxr, mujoco, mujoco_usd_converter):
``python -m sim_scenes.isaaclab.assets MJCF OUT_DIR``. The main environment imports this module
for :func:`srgb_to_linear`, so those packages are imported inside the functions that use them.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from robo_pipe.atomic import discard_dead_temporaries, replace_dir, temporary_path
from robo_pipe.errors import RoboPipeError

if TYPE_CHECKING:
    from pxr import Sdf, Usd

GRAVCOMP_AS_CONVERTED = "mjc:body:gravcomp"
"""The converter's name for a body's gravity compensation (no reader knows it)."""
GRAVCOMP = "mjc:gravcomp"
"""The name Newton's MuJoCo solver reads (``SolverMuJoCo``'s ``gravcomp`` body attribute)."""
DISPLAY_COLOR = "primvars:displayColor"
SITE_SCHEMAS = frozenset({"MjcSiteAPI", "NewtonSiteAPI"})
"""API schemas the converter applies to an MJCF site's prim."""
JOINT_SCHEMA = "MjcJointAPI"
SOLREFLIMIT = "mjc:solreflimit"
"""A joint limit's softness, MuJoCo's ``solreflimit`` (time constant s, damping ratio)."""
USD_SUFFIXES = (".usda", ".usdc", ".usd")

LIMIT_TOLERANCE = 1e-6
"""Relative tolerance on joint limits and their softness (USD stores limits as 32-bit floats)."""
FRAME_TOLERANCE = 1e-5
"""Absolute tolerance on joint axes (unit vectors) and anchors (m), also 32-bit in USD."""


class AssetBuildError(RoboPipeError, ValueError):
    """The MJCF cannot be converted, or its USD disagrees with MuJoCo (each problem named)."""


def srgb_to_linear(rgb: tuple[float, float, float]) -> tuple[float, float, float]:
    """Decode a display (sRGB-encoded) colour, as MJCF ``rgba`` and colour pickers give it, to
    the linear colour USD ``displayColor`` holds: the standard sRGB transfer function (EOTF)
    on each channel, each in [0, 1]."""
    red, green, blue = rgb
    return (
        _srgb_channel_to_linear(red),
        _srgb_channel_to_linear(green),
        _srgb_channel_to_linear(blue),
    )


def _srgb_channel_to_linear(value: float) -> float:
    if value <= 0.04045:
        return value / 12.92
    return float(((value + 0.055) / 1.055) ** 2.4)


def build_robot_usd(mjcf: Path, out_dir: Path) -> Path:
    """Convert the MJCF file ``mjcf`` to USD in ``out_dir``, fix the conversion (see the module
    docstring), check the joints against MuJoCo's, and return the asset's root layer
    (``out_dir/<model>.usda``, beside ``Payload/``).

    The output is written under a temporary name beside ``out_dir`` and replaces it in one
    step (:func:`robo_pipe.atomic.replace_dir`): a failed or killed build leaves the previous
    output whole. The same MJCF gives byte-identical files.

    Raises:
        AssetBuildError: no MJCF there, MuJoCo cannot compile it, or :func:`check_joints` finds
            a problem.
    """
    from mujoco_usd_converter import Converter

    mjcf, out_dir = Path(mjcf), Path(out_dir)
    if not mjcf.is_file():
        raise AssetBuildError(f"{mjcf}: MJCF file not found")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    discard_dead_temporaries(out_dir.parent, of=out_dir.name)
    staging = temporary_path(out_dir)
    try:
        try:
            asset = Converter().convert(str(mjcf), str(staging))
        except ValueError as err:  # MuJoCo's parse and compile errors
            raise AssetBuildError(f"{mjcf}: MuJoCo cannot compile it: {err}") from err
        # Named after the MJCF's model name, which need not be the file's.
        root_name = Path(asset.path).name
        fix_conversion(staging / root_name)
        problems = check_joints(mjcf, staging / root_name)
        if problems:
            raise AssetBuildError(
                f"{mjcf}: its USD conversion disagrees with MuJoCo, {out_dir} left as it was:\n"
                + "\n".join(problems)
            )
        replace_dir(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already after a successful replace
    return out_dir / root_name


def fix_conversion(root_layer: Path) -> None:
    """Fix, in place, the converter's layers in the folder of ``root_layer`` (the asset's root
    ``.usda``): rename gravity compensation, linearize display colours, remove sites, author
    joint limits' softness, then recompute the root prim's ``extentsHint`` (it counted the
    sites). Each edited layer says what was changed in its ``customLayerData``. Run once, on a
    fresh conversion: a second run would linearize the colours twice."""
    import mujoco_usd_converter  # noqa: F401  registers the mjc schemas, for their fallbacks
    from pxr import Sdf, Usd, UsdGeom

    layers = [
        Sdf.Layer.FindOrOpen(str(path))
        for path in sorted(root_layer.parent.rglob("*"))
        if path.suffix in USD_SUFFIXES
    ]
    sites = sorted({path for layer in layers for path in _site_paths(layer)})
    for layer in layers:
        changes = (
            _rename_gravcomp(layer)
            + _linearize_colours(layer)
            + _remove_sites(layer, sites)
            + _author_limit_softness(layer)
        )
        if changes:
            _note(layer, changes)

    stage = Usd.Stage.Open(str(root_layer))  # composes the layers as just edited, in memory
    default_prim = stage.GetDefaultPrim()
    model = UsdGeom.ModelAPI(default_prim)
    if model.GetExtentsHintAttr().HasAuthoredValue():
        purposes = UsdGeom.Imageable.GetOrderedPurposeTokens()
        cache = UsdGeom.BBoxCache(Usd.TimeCode.Default(), purposes, useExtentsHint=False)
        extents = model.ComputeExtentsHint(cache)
        root = Sdf.Layer.FindOrOpen(str(root_layer))
        hint = root.GetAttributeAtPath(default_prim.GetPath().AppendProperty("extentsHint"))
        if hint is not None and hint.default != extents:
            hint.default = extents
            _note(root, ["extentsHint recomputed (sites removed)"])
    for layer in layers:
        if layer.dirty:
            layer.Save()


def _prim_specs(layer: Sdf.Layer) -> list[Sdf.PrimSpec]:
    """Every prim spec in ``layer``, parents before children, in the layer's order."""
    from pxr import Sdf

    found: list[Sdf.Path] = []
    layer.Traverse(Sdf.Path.absoluteRootPath, found.append)
    return [layer.GetPrimAtPath(path) for path in found if path.IsPrimPath()]


def _rename_gravcomp(layer: Sdf.Layer) -> list[str]:
    """Rename every ``mjc:body:gravcomp`` to ``mjc:gravcomp``, same type and value."""
    from pxr import Sdf

    renamed = 0
    for prim in _prim_specs(layer):
        old = prim.attributes.get(GRAVCOMP_AS_CONVERTED)
        if old is None:
            continue
        new = Sdf.AttributeSpec(prim, GRAVCOMP, old.typeName, old.variability, old.custom)
        new.default = old.default
        prim.RemoveProperty(old)
        renamed += 1
    return [f"{GRAVCOMP_AS_CONVERTED} renamed {GRAVCOMP} ({renamed} bodies)"] if renamed else []


def _linearize_colours(layer: Sdf.Layer) -> list[str]:
    """Convert every ``primvars:displayColor`` value from sRGB to linear."""
    from pxr import Gf, Vt

    converted = 0
    for prim in _prim_specs(layer):
        colour = prim.attributes.get(DISPLAY_COLOR)
        # The converter writes a default value only (no time samples).
        if colour is None or colour.default is None:
            continue
        colour.default = Vt.Vec3fArray(
            [Gf.Vec3f(*srgb_to_linear((c[0], c[1], c[2]))) for c in colour.default]
        )
        converted += 1
    return [f"{DISPLAY_COLOR} sRGB to linear ({converted} prims)"] if converted else []


def _author_limit_softness(layer: Sdf.Layer) -> list[str]:
    """Author ``mjc:solreflimit`` on every MuJoCo joint that lacks it, with the schema's
    fallback (the value the converter left out as redundant)."""
    from pxr import Sdf, Usd

    definition = Usd.SchemaRegistry().FindAppliedAPIPrimDefinition(JOINT_SCHEMA)
    if definition is None:
        raise AssetBuildError(f"the USD schema {JOINT_SCHEMA} is not registered")
    fallback = definition.GetAttributeDefinition(SOLREFLIMIT)
    authored = 0
    for prim in _prim_specs(layer):
        if JOINT_SCHEMA not in _api_schemas(prim) or SOLREFLIMIT in prim.attributes:
            continue
        attr = Sdf.AttributeSpec(
            prim, SOLREFLIMIT, fallback.GetTypeName(), fallback.GetVariability()
        )
        attr.default = fallback.GetFallbackValue()
        authored += 1
    return [f"{SOLREFLIMIT} authored ({authored} joints)"] if authored else []


def _api_schemas(prim: Sdf.PrimSpec) -> set[str]:
    """The API schemas ``prim`` applies (whatever its list operation)."""
    if not prim.HasInfo("apiSchemas"):
        return set()
    return set(prim.GetInfo("apiSchemas").ApplyOperations([]))


def _site_paths(layer: Sdf.Layer) -> list[Sdf.Path]:
    """The prims ``layer`` applies a site schema to (MJCF sites)."""
    return [prim.path for prim in _prim_specs(layer) if SITE_SCHEMAS & _api_schemas(prim)]


def _remove_sites(layer: Sdf.Layer, sites: list[Sdf.Path]) -> list[str]:
    """Remove the prims at ``sites`` (with any children) from ``layer``: a site's geometry
    layer defines it, its physics layer applies the site schemas over it."""
    removed = []
    for path in sites:
        if layer.GetPrimAtPath(path) is None:
            continue
        del layer.GetPrimAtPath(path.GetParentPath()).nameChildren[path.name]
        removed.append(path.name)
    return [f"sites removed: {', '.join(removed)}"] if removed else []


def _note(layer: Sdf.Layer, changes: list[str]) -> None:
    """Say in ``layer``'s metadata what this module changed, beside the converter's name."""
    data = dict(layer.customLayerData)
    data["robo_pipe"] = "sim_scenes.isaaclab.assets: " + "; ".join(changes)
    layer.customLayerData = data


def check_joints(mjcf: Path, usd: Path) -> list[str]:
    """Compare every joint of the MJCF file ``mjcf`` (compiled by MuJoCo) with the joint of the
    same name in the USD asset ``usd``: its type (hinge: revolute, slide: prismatic), the two
    bodies it connects, its axis and anchor in both bodies' frames (at the zero
    configuration), its limits (MJCF radians, USD degrees for a revolute joint) and their
    softness (``mjc:solreflimit``, which must be authored: Newton replaces a missing one).

    Returns one line per problem (empty when they all match): a joint missing from the USD,
    a moving USD joint the MJCF does not have, or a mismatch, with both values. Only hinge
    and slide joints are known: any other MJCF joint type is reported as a problem.
    """
    import mujoco
    from pxr import Usd, UsdPhysics

    model = mujoco.MjModel.from_xml_path(str(mjcf))
    stage = Usd.Stage.Open(str(usd))
    usd_joints: dict[str, Usd.Prim] = {}
    for prim in stage.Traverse():
        # A fixed joint holds a body that has no MJCF joint in place (the base on the world).
        if prim.IsA(UsdPhysics.Joint) and not prim.IsA(UsdPhysics.FixedJoint):
            usd_joints[_mjcf_name(prim)] = prim

    problems = []
    for joint in range(model.njnt):
        name = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, joint) or f"#{joint}"
        prim = usd_joints.pop(name, None)
        if prim is None:
            problems.append(f"{usd}: joint {name!r}: missing (it is in {mjcf})")
            continue
        problems += [f"{usd}: joint {name!r}: {p}" for p in _joint_problems(model, joint, prim)]
    for name, prim in usd_joints.items():
        problems.append(f"{usd}: joint {name!r} ({prim.GetPath()}): not in {mjcf}")
    return problems


def _mjcf_name(prim: Usd.Prim) -> str:
    """The MJCF name of a converted prim: the converter keeps it as the display name when it is
    not a valid prim name."""
    return prim.GetDisplayName() or prim.GetName()


def _joint_problems(model: Any, joint: int, prim: Usd.Prim) -> list[str]:
    """How the USD joint ``prim`` differs from MuJoCo's joint ``joint`` of ``model``."""
    import mujoco
    import numpy as np
    from pxr import Gf, UsdPhysics

    kinds = {
        mujoco.mjtJoint.mjJNT_HINGE: ("hinge", UsdPhysics.RevoluteJoint, 180.0 / math.pi),
        mujoco.mjtJoint.mjJNT_SLIDE: ("slide", UsdPhysics.PrismaticJoint, 1.0),
    }
    kind = mujoco.mjtJoint(model.jnt_type[joint])
    if kind not in kinds:
        return [f"MJCF type {kind.name}: only hinge and slide joints are checked"]
    kind_name, usd_type, usd_per_mjcf_unit = kinds[kind]
    if not prim.IsA(usd_type):
        return [f"MJCF {kind_name}, USD {prim.GetTypeName()} (expected {usd_type.__name__})"]
    typed = usd_type(prim)
    problems = []

    # The bodies: the joint moves its MJCF body (body1) relative to the parent (body0).
    stage = prim.GetStage()
    body = int(model.jnt_bodyid[joint])
    parent = int(model.body_parentid[body])
    for rel, mjcf_body in ((typed.GetBody1Rel(), body), (typed.GetBody0Rel(), parent)):
        targets = rel.GetTargets()
        usd_body = _mjcf_name(stage.GetPrimAtPath(targets[0])) if targets else None
        expected = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, mjcf_body)
        if mjcf_body != 0 and usd_body != expected:  # body 0: the world, whatever USD names
            problems.append(f"{rel.GetName()} is {usd_body}, MJCF body {expected}")

    # Axis and anchor, in the child's frame and, at the zero configuration, in the parent's
    # (MuJoCo gives them in the child's; the child's pose in the parent is body_pos/body_quat).
    axis_in_joint = np.eye(3)["XYZ".index(typed.GetAxisAttr().Get())]
    mjcf_axis, mjcf_anchor = model.jnt_axis[joint], model.jnt_pos[joint]
    rotation_flat = np.zeros(9)
    mujoco.mju_quat2Mat(rotation_flat, model.body_quat[body])
    to_parent = rotation_flat.reshape(3, 3)
    frames = (
        ("body1", typed.GetLocalRot1Attr(), typed.GetLocalPos1Attr(), np.eye(3), np.zeros(3)),
        (
            "body0",
            typed.GetLocalRot0Attr(),
            typed.GetLocalPos0Attr(),
            to_parent,
            model.body_pos[body],
        ),
    )
    for frame, rot_attr, pos_attr, rotation, offset in frames:
        joint_rotation = Gf.Rotation(Gf.Quatd(rot_attr.Get() or Gf.Quatf(1.0)))
        usd_axis = np.array(joint_rotation.TransformDir(Gf.Vec3d(*axis_in_joint)))
        expected_axis = rotation @ mjcf_axis
        if not np.allclose(usd_axis, expected_axis, atol=FRAME_TOLERANCE):
            problems.append(f"axis in {frame} frame {_vec(usd_axis)}, MuJoCo {_vec(expected_axis)}")
        usd_anchor = np.array(pos_attr.Get() or (0.0, 0.0, 0.0))
        expected_anchor = offset + rotation @ mjcf_anchor
        if not np.allclose(usd_anchor, expected_anchor, atol=FRAME_TOLERANCE):
            problems.append(
                f"anchor in {frame} frame {_vec(usd_anchor)} m, MuJoCo {_vec(expected_anchor)} m"
            )

    # Limits: USD has none when both are unauthored or infinite.
    usd_limits = [typed.GetLowerLimitAttr().Get(), typed.GetUpperLimitAttr().Get()]
    unit = "deg" if usd_per_mjcf_unit != 1.0 else "m"
    if model.jnt_limited[joint]:
        for side, usd_value, mjcf_value in zip(
            ("lower", "upper"), usd_limits, model.jnt_range[joint], strict=True
        ):
            limit = float(mjcf_value) * usd_per_mjcf_unit
            if usd_value is None or not math.isclose(
                usd_value, limit, rel_tol=LIMIT_TOLERANCE, abs_tol=1e-9
            ):
                problems.append(f"{side} limit {usd_value} {unit}, MuJoCo {limit:.6g} {unit}")
        softness = prim.GetAttribute(SOLREFLIMIT)
        expected_softness = model.jnt_solref[joint]
        if not softness.HasAuthoredValue():
            problems.append(
                f"{SOLREFLIMIT} not authored (Newton then uses its own limit gains), "
                f"MuJoCo {_vec(expected_softness)}"
            )
        elif not np.allclose(softness.Get(), expected_softness, rtol=LIMIT_TOLERANCE):
            problems.append(
                f"{SOLREFLIMIT} {_vec(softness.Get())}, MuJoCo {_vec(expected_softness)}"
            )
    elif any(value is not None and math.isfinite(value) for value in usd_limits):
        problems.append(f"limits {usd_limits} {unit}, MuJoCo: unlimited")
    return problems


def _vec(values: Any) -> str:
    return "(" + ", ".join(f"{float(v):.4g}" for v in values) + ")"


def main(argv: list[str] | None = None) -> int:
    """``python -m sim_scenes.isaaclab.assets MJCF OUT_DIR``: build the USD and print the path
    of every file written, one a line; exit 2 with the problems when the build is refused."""
    parser = argparse.ArgumentParser(
        prog="python -m sim_scenes.isaaclab.assets",
        description="Convert a robot's MJCF to the USD Isaac Lab loads (see the module doc).",
    )
    parser.add_argument("mjcf", type=Path, help="the robot's MJCF file")
    parser.add_argument("out_dir", type=Path, help="the folder to (re)place the USD in")
    args = parser.parse_args(argv)
    try:
        root = build_robot_usd(args.mjcf, args.out_dir)
    except RoboPipeError as err:
        for line in str(err).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return 2
    for path in sorted(p for p in root.parent.rglob("*") if p.is_file()):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
