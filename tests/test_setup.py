"""The set-up script: without root it installs nothing and prints the exact command."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def fake_bin(tmp_path: Path, name: str, body: str) -> None:
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def test_system_deps_without_root_prints_the_apt_command(tmp_path: Path) -> None:
    fake_bin(tmp_path, "id", "echo 1000")  # not root
    fake_bin(tmp_path, "dpkg-query", "exit 1")  # nothing installed
    fake_bin(tmp_path, "apt-get", "echo apt-get must not run >&2; exit 99")
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    result = subprocess.run(
        ["bash", str(ROOT / "scripts/install_system_deps.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert "sudo apt-get update && sudo apt-get install -y libegl1" in result.stderr
    assert "libosmesa6" in result.stderr
    assert "must not run" not in result.stderr
