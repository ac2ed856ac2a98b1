"""Does a non-editable install of robo-pipe work outside the source tree?

Builds a wheel of the repository (``pip wheel --no-deps``, from a copy of the packaged files, so
the working tree gets no ``build/``), installs it into a temporary folder (``pip install
--no-deps --target``) and, from a working directory outside the repository, with only that
folder on ``PYTHONPATH`` (the dependencies come from the running environment), runs:

* ``robo-pipe config --config demo.yaml`` (from a folder without it): the shipped config resolves;
* ``robo-pipe gate <export> --target local-cpu --steps 50`` (its default config): the
  shipped target profile is found by name and the latency gate runs an export of a tiny policy;
* the code version, which outside a git checkout is ``robo-pipe==<version>``;

each through ``pipelines.cli.main`` after checking that every robo-pipe package (``configs``,
``robo_pipe``, ``pipelines``, ``stages``, ``robots``, ``sim_scenes``, ``deploy_edge``) was
imported from the install, not from the repository; and the console script ``robo-pipe`` the
wheel installs runs ``robo-pipe config`` too.

Run: ``python benchmarks/install_smoke.py [--quick]`` (about a minute; ``--quick`` skips the
console script run). The last line is ``key=value`` pairs; the exit status is 1 on a failure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("configs", "robo_pipe", "pipelines", "stages", "robots", "sim_scenes", "deploy_edge")

# Run inside the installed copy: check where every package came from, then the CLI.
CLI = f"""
import importlib, sys
root, *args = sys.argv[1:]
for name in {PACKAGES!r}:
    where = importlib.import_module(name).__file__ or ""
    if not where.startswith(root):
        sys.exit(f"{{name}} imported from {{where}}, not from the install {{root}}")
from pipelines.cli import main
sys.argv = ["robo-pipe", *args]
main()
"""

VERSION = """
from stages.provenance import code_version
print(code_version())
"""


def build_wheel(out: Path) -> Path:
    """A wheel of the repository in ``out`` (no dependencies, no build isolation: this
    environment's setuptools), built from a copy of the files the wheel packages."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    tops = sorted({pattern.rstrip("*").split(".")[0] for pattern in include})
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for name in ("pyproject.toml", pyproject["project"]["readme"]):
            shutil.copy2(ROOT / name, src / name)
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        for top in tops:
            shutil.copytree(ROOT / top, src / top, ignore=ignore)
        out.mkdir(parents=True, exist_ok=True)
        pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        subprocess.run(
            [*pip, "-w", str(out), str(src)],
            check=True,
            capture_output=True,
            text=True,
        )
    (wheel,) = out.glob("robo_pipe-*.whl")
    return wheel


def wheel_files(wheel: Path) -> set[str]:
    """The paths inside ``wheel``."""
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def make_export(out: Path) -> Path:
    """An export of a random-weight policy of the tiny profile (``configs/tiny.yaml``: its
    policy, cameras and 32 px images; rp5's 6 joints)."""
    import torch

    from pipelines.config import CONFIG_DIR, load_config
    from robots.spec import get_robot
    from stages.export import export
    from stages.policy.checkpoint import new_policy, save_policy

    tiny = load_config(CONFIG_DIR / "tiny.yaml")
    torch.manual_seed(0)
    policy, _ = new_policy(tiny.policy, tiny.scene.cameras, tiny.scene.image_size, "rp5", 6, 6)
    save_policy(policy, out / "ckpt", None)
    return Path(export(out / "ckpt", out / "export", get_robot(tiny.robot).control_hz).path)


def run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``args`` in ``cwd``; its output shown on failure."""
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        print(result.stdout[-3000:], result.stderr[-3000:], sep="\n", file=sys.stderr)
        shown = " ".join("<code>" if "\n" in a else a for a in args)
        raise SystemExit(f"failed (exit {result.returncode}): {shown}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="skip the console script run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="robo-pipe-install-") as tmp_name:
        tmp = Path(tmp_name)
        start = time.perf_counter()
        wheel = build_wheel(tmp / "dist")
        build_s = time.perf_counter() - start
        files = wheel_files(wheel)
        shipped = ["configs/demo.yaml", "configs/targets/local-cpu.yaml", "robots/rp5/rp5.xml"]
        missing = [f for f in shipped if f not in files]
        if missing:
            raise SystemExit(f"{wheel.name} lacks {', '.join(missing)}")
        site = tmp / "site"
        pip = [sys.executable, "-m", "pip", "install", "--no-deps", "-q"]
        subprocess.run(
            [*pip, "--target", str(site), str(wheel)],
            check=True,
            capture_output=True,
        )
        export_dir = make_export(tmp / "work")
        outside = tmp / "elsewhere"  # no configs/ here: only the install can provide them
        outside.mkdir()
        env = {
            **os.environ,
            "PYTHONPATH": str(site),
            "ROBO_PIPE_HOME": str(tmp / "home"),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        demo = "demo.yaml"  # a shipped config, named as a user would from any folder
        cli = [sys.executable, "-c", CLI, str(site)]

        shown = run([*cli, "config", "--config", demo], outside, env).stdout
        config_ok = "# config hash" in shown and "robot: rp5" in shown
        start = time.perf_counter()
        gate = [*cli, "gate", str(export_dir), "--target", "local-cpu", "--steps", "50"]
        gated = run(
            [*gate, "--warmup", "10", "--no-pace", "--json"], outside, env
        )  # default config
        gate_s = time.perf_counter() - start
        report = gated.stdout.strip().splitlines()[-1]
        gate_ok = '"target": "local-cpu"' in report and '"passed": true' in report
        version = run([sys.executable, "-c", VERSION], outside, env).stdout.strip()
        version_ok = version.startswith("robo-pipe==")
        script_ok = True
        if not args.quick:
            script = site / "bin" / "robo-pipe"
            script_ok = (
                "# config hash" in run([str(script), "config", "-c", demo], outside, env).stdout
            )
    ok = config_ok and gate_ok and version_ok and script_ok
    print(f"wheel {wheel.name}: {len(files)} files, built in {build_s:.1f} s")
    print(f"gate from the install: {report[:200]}")
    print(
        f"ok={ok} config={config_ok} gate={gate_ok} gate_s={gate_s:.1f} "
        f"code_version={version} console_script={'skipped' if args.quick else script_ok}"
    )
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
