"""``python -m deploy_edge.policy_client``: run a robot at its control rate on the policy an edge
agent serves (see ``--help``)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml

from deploy_edge.policy_client.remote_policy import PolicyServerError, RemotePolicy
from deploy_edge.policy_client.remote_run import probe_inference, run_remote
from robots.interface import load_driver

TOKEN_ENV = "ROBO_PIPE_POLICY_TOKEN"
"""Where ``python -m deploy_edge.policy_client`` reads the agent's bearer token by default."""


def main(argv: list[str] | None = None) -> int:
    """``python -m deploy_edge.policy_client``: the asynchronous loop on a robot driver against
    an agent's policy server; prints one ``key=value`` line; exit 2 on a refusal."""
    parser = argparse.ArgumentParser(
        prog="python -m deploy_edge.policy_client",
        description="Run a robot at its control rate on the policy an edge agent serves "
        "(WS /policy): inference on the agent, actuation here, asynchronously.",
    )
    parser.add_argument("--url", required=True, help="the agent: ws://host:port or wss://...")
    parser.add_argument(
        "--token-env", default=TOKEN_ENV, help=f"variable holding the token (default {TOKEN_ENV})"
    )
    parser.add_argument("--ca-cert", type=Path, help="PEM to verify a wss:// agent with")
    parser.add_argument(
        "--driver",
        default="sim_scenes.sim_robot:simulated_rp5",
        help="module:callable(cameras, image_size, **driver args) -> Robot (default: the "
        "simulated rp5; a ROS 2 arm: robots.ros2.driver:ros2_robot --driver-arg config=ARM.yaml)",
    )
    parser.add_argument(
        "--driver-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a keyword argument of the driver, its value read as YAML (repeatable)",
    )
    parser.add_argument("--instruction", default="touch the red cube")
    parser.add_argument("--ticks", type=int, default=100, help="control periods to run")
    parser.add_argument(
        "--inference-ms",
        type=float,
        help="p99 round trip the trigger is derived from (default: measured by --probes)",
    )
    parser.add_argument("--probes", type=int, default=10, help="inferences to measure it with")
    parser.add_argument("--margin-ms", type=float, default=20.0, help="added to the p99")
    parser.add_argument("--blend", choices=["linear", "none"], default="linear")
    parser.add_argument("--timeout-s", type=float, default=2.0, help="per connect and answer")
    args = parser.parse_args(argv)
    token = os.environ.get(args.token_env, "")
    if not token:
        print(f"error: token variable {args.token_env} is not set", file=sys.stderr)
        return 2
    try:
        policy = RemotePolicy(args.url, token, args.timeout_s, args.ca_cert)
        driver_args = dict(_keyword(arg) for arg in args.driver_arg)
        robot = load_driver(args.driver)(
            tuple(policy.info.cameras), policy.info.image_size, **driver_args
        )
        robot.connect()  # a robot that does not answer (a ROS 2 arm's topics) is named here
    except Exception as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        inference_s = (
            args.inference_ms / 1000.0
            if args.inference_ms is not None
            else probe_inference(policy, robot, args.instruction, args.probes)
        )
        summary, _ = run_remote(
            policy,
            robot,
            args.instruction,
            args.ticks,
            inference_s,
            args.margin_ms / 1000.0,
            args.blend,
        )
    except (ValueError, PolicyServerError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        robot.stop()
        policy.close()
    print(" ".join(f"{k}={v}" for k, v in summary.to_json().items() if k != "first_error"))
    if summary.first_error:
        print(f"first error: {summary.first_error}", file=sys.stderr)
    return 0


def _keyword(arg: str) -> tuple[str, object]:
    """``KEY=VALUE`` -> (key, the value read as YAML: ``seed=3`` is an int)."""
    key, sep, value = arg.partition("=")
    if not (sep and key.isidentifier()):
        raise ValueError(f"--driver-arg {arg!r}: expected KEY=VALUE")
    return key, yaml.safe_load(value)


if __name__ == "__main__":
    sys.exit(main())
