"""``python -m deploy_edge.agent --config device.yaml``: run the edge agent on this device (what
``robo-pipe edge-agent`` runs; a device needs only the ``edge`` extra for this)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from deploy_edge.agent.config import load_device_config
from deploy_edge.agent.service import serve
from robo_pipe.errors import RoboPipeError


def main() -> None:
    """Parse ``--config``, serve; a bad config (or a file it names) is one line and exit 2."""
    parser = argparse.ArgumentParser(prog="python -m deploy_edge.agent", description=__doc__)
    parser.add_argument("--config", type=Path, required=True, help="device config YAML")
    args = parser.parse_args()
    try:
        serve(load_device_config(args.config))  # stops cleanly on SIGTERM (then exits by it)
    except RoboPipeError as err:  # the config, or a file it names, checked before listening
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)  # 128 + SIGINT, as a shell reports it


if __name__ == "__main__":
    main()
