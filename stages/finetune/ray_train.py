"""BC training on Ray Train workers, and the metrics its workers write forwarded to the caller.

:func:`fit_on_ray_train` runs :func:`stages.finetune.bc.train_bc` as Ray Train's
``train_loop_per_worker`` (each rank writes which Ray node it ran on under
``out/.workers/``); :func:`forwarding_metrics` forwards the ``metrics.jsonl`` lines the
training writes in other processes while it runs.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

from stages.finetune.bc import BCJob, train_bc
from stages.finetune.checkpoints import read_metrics

WORKERS_DIR = ".workers"
"""Under a training run's folder: one file per Ray Train worker rank naming its Ray node."""

MetricsFn = Callable[[dict[str, float]], None]


@contextlib.contextmanager
def forwarding_metrics(out: Path, on_metrics: MetricsFn | None) -> Iterator[None]:
    """While the body trains (in other processes), forward new metrics.jsonl lines."""
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_metrics, args=(out, on_metrics, stop), daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()


def _watch_metrics(out: Path, on_metrics: MetricsFn | None, stop: threading.Event) -> None:
    """Forward new lines of metrics.jsonl to ``on_metrics`` (training runs in other processes)."""
    seen = 0.0
    while True:
        finished = stop.wait(0.5)
        for record in read_metrics(out):
            if record["step"] > seen:
                seen = record["step"]
                if on_metrics:
                    on_metrics(record)
        if finished:
            return


def _ray_train_loop(config: dict[str, BCJob]) -> None:
    """Ray Train's ``train_loop_per_worker``: the BC loop of ``config["job"]`` with this
    worker's rank (which node it runs on goes to ``out/.workers/rank-<r>``, read into the
    checkpoint's record)."""
    import ray.train

    from stages.ray_runtime import node_id

    ctx = ray.train.get_context()
    job = config["job"]
    rank = ctx.get_world_rank()
    workers = Path(job.out) / WORKERS_DIR
    workers.mkdir(parents=True, exist_ok=True)
    (workers / f"rank-{rank}").write_text(node_id())
    train_bc(job, rank, ctx.get_world_size())


def fit_on_ray_train(job: BCJob, workers: int, ray_address: str | None) -> None:
    """Train ``job`` on ``workers`` Ray Train workers (DDP over gloo, one CPU each), on the
    cluster at ``ray_address`` (else a local Ray); a failed worker group is restarted twice."""
    from stages.ray_runtime import init_ray, signal_handlers_kept

    init_ray(ray_address)  # before importing ray (see stages/ray_runtime.py)
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    threads = max(1, (os.cpu_count() or 1) // workers)
    trainer = TorchTrainer(
        _ray_train_loop,
        train_loop_config={"job": replace(job, threads=threads)},
        scaling_config=ScalingConfig(
            num_workers=workers, use_gpu=False, resources_per_worker={"CPU": 1}
        ),
        torch_config=TorchConfig(backend="gloo"),
        # A failed worker group is restarted; train_bc resumes from the latest checkpoint.
        run_config=RunConfig(
            name=Path(job.out).name,
            storage_path=str(Path(job.out) / "ray"),
            failure_config=FailureConfig(max_failures=2),
        ),
    )
    # Ray Train's fit installs a SIGINT handler of its own and never removes it: Ctrl-C then
    # asks the training to abort and lets fit return, during this stage and, after it, in
    # every later one (the run went on). Ctrl-C must stop the run here as anywhere else (a
    # KeyboardInterrupt through every ``finally``; Ray's exit stops the training workers).
    trainer._register_sigint_handler = lambda _controller: None  # type: ignore[attr-defined]
    with signal_handlers_kept():
        trainer.fit()
