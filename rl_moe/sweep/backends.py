"""How a sweep runs its trials: one after another, side by side on this machine, or on Ray."""

from __future__ import annotations

import math
import os
import queue
import threading
from collections.abc import Generator, Iterator, Sequence
from concurrent.futures import CancelledError, ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from rl_moe.cli import EXIT_INTERRUPTED, reraise_interrupt
from rl_moe.sweep.trials import Outcome, SweepConfig, SweepError, Trial, TrialRunner

#: A backend's stream of outcomes (a generator, so the sweep can close it and stop its trials).
Outcomes = Generator[Outcome, None, None]


def run_sequential(jobs: Sequence[tuple[Trial, list[str]]], env: dict[str, str], runner: TrialRunner) -> Outcomes:
    """Run trials one after another in this process; a trial stopped by Ctrl-C stops the sweep."""
    for trial, command in jobs:
        outcome = runner(trial, command, env)
        yield outcome
        if interrupted(outcome):
            raise KeyboardInterrupt


def interrupted(outcome: Outcome) -> bool:
    """The trial exited as Ctrl-C makes the CLI exit (SIGINT reaches the whole process group, and
    a child can finish before the sweep itself sees the signal)."""
    return outcome.returncode == EXIT_INTERRUPTED


#: Ray's workers raise their niceness by this much (Ray's default is 15), and a trial's process
#: inherits it: beside two training runs, a two-trial smoke sweep took 148.5 s on Ray's default
#: against 21.5 s on the local backend (benchmarks/README.md, sweep_under_load.py). A cluster the
#: sweep starts gets 0, so its trials run at the sweep's own priority, as the local backend's do;
#: a value the user set is kept.
RAY_WORKER_NICENESS = "RAY_worker_niceness"


@contextmanager
def _workers_at_our_priority() -> Iterator[None]:
    """``RAY_worker_niceness=0`` while the block starts a cluster (the raylet copies the environment
    then), unless the user set it; ``os.environ`` is as it was afterwards, also if the start fails."""
    if RAY_WORKER_NICENESS in os.environ:
        yield
        return
    os.environ[RAY_WORKER_NICENESS] = "0"
    try:
        yield
    finally:
        os.environ.pop(RAY_WORKER_NICENESS, None)


@dataclass(frozen=True)
class RayOptions:
    """How to reach Ray: ``address`` None starts a local cluster of ``num_cpus`` CPUs."""

    address: str | None = None
    num_cpus: int | None = None
    num_gpus: int | None = None
    init_kwargs: dict = field(default_factory=dict)


def run_ray(
    jobs: Sequence[tuple[Trial, list[str]]], env: dict[str, str], runner: TrialRunner, cfg: SweepConfig, opts: RayOptions
) -> Outcomes:
    """Run trials as Ray tasks, each reserving ``cpus_per_trial``/``gpus_per_trial``; yields as they finish."""
    import ray  # lazy: optional dependency (the ray extra)

    started_here = not ray.is_initialized()
    if started_here:
        if opts.address is not None:
            ray.init(address=opts.address, **opts.init_kwargs)
        else:
            with _workers_at_our_priority():
                ray.init(num_cpus=opts.num_cpus, num_gpus=opts.num_gpus, include_dashboard=False, **opts.init_kwargs)
    pending: list = []
    try:  # from here on, a cluster started here is shut down whatever happens
        remote = ray.remote(num_cpus=cfg.cpus_per_trial, num_gpus=cfg.gpus_per_trial, max_retries=0)(runner)
        pending = [remote.remote(trial, command, env) for trial, command in jobs]
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            yield ray.get(ready[0])
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
        if started_here:
            ray.shutdown()


def ray_available() -> bool:
    """Ray is installed (the ``sweep`` extra)."""
    try:
        import ray  # noqa: F401
    except ImportError as exc:
        reraise_interrupt(exc)
        return False
    return True


def check_parallel(cfg: SweepConfig) -> None:
    if cfg.parallel is not None and cfg.parallel < 1:
        raise SweepError(f"--parallel must be >= 1, got {cfg.parallel}")


def visible_gpus() -> int:
    """CUDA devices this process sees."""
    return torch.cuda.device_count()


def local_slots(cfg: SweepConfig, num_cpus: int, n_gpus: int) -> int:
    """How many trials the local backend runs side by side: ``cfg.parallel`` when given, else as
    many as ``num_cpus`` CPUs hold at ``cpus_per_trial`` each and, for GPU trials, as many as
    ``n_gpus`` GPUs hold at ``gpus_per_trial`` each; at least one.

    :raises SweepError: ``parallel`` below 1, or GPU trials without a visible GPU
    """
    check_parallel(cfg)
    if cfg.gpus_per_trial > 0 and n_gpus < 1:
        raise SweepError(
            f"--gpus-per-trial {cfg.gpus_per_trial} needs a visible CUDA device and none is visible; use --gpus-per-trial 0 for CPU trials"
        )
    if cfg.parallel is not None:
        return cfg.parallel
    slots = _fits(num_cpus, cfg.cpus_per_trial)
    if cfg.gpus_per_trial > 0:
        slots = min(slots, _fits(n_gpus, cfg.gpus_per_trial))
    return max(1, slots)


def _fits(total: float, each: float) -> int:
    return math.floor(total / each + 1e-9)  # 1 // 0.1 is 9.0 in floating point


class LocalPlan(NamedTuple):
    """The local backend's ``slots`` (trials side by side) and the ``n_gpus`` it spreads them over."""

    slots: int
    n_gpus: int


def plan_local(cfg: SweepConfig, num_cpus: int | None, n_jobs: int) -> LocalPlan:
    """:func:`local_slots` on this machine (``num_cpus`` None: all its CPUs), never more than ``n_jobs``."""
    n_gpus = visible_gpus() if cfg.gpus_per_trial > 0 else 0
    slots = local_slots(cfg, (os.cpu_count() or 1) if num_cpus is None else num_cpus, n_gpus)
    return LocalPlan(max(1, min(slots, n_jobs)), n_gpus)


def pin_gpu(env: dict[str, str], slot: int, n_gpus: int) -> dict[str, str]:
    """``env`` with ``CUDA_VISIBLE_DEVICES`` set to GPU ``slot % n_gpus`` of those this process sees,
    when it sees more than one; with one GPU every trial shares it as is."""
    if n_gpus < 2:
        return env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    ids = [d.strip() for d in visible.split(",")][:n_gpus] if visible else [str(i) for i in range(n_gpus)]
    return {**env, "CUDA_VISIBLE_DEVICES": ids[slot % len(ids)]}


def run_local(jobs: Sequence[tuple[Trial, list[str]]], env: dict[str, str], runner: TrialRunner, plan: LocalPlan) -> Outcomes:
    """Run ``plan.slots`` trials at a time, each from a thread that waits on it (``subprocess.run``
    releases the GIL); yields outcomes as they finish.

    A running trial holds a slot, and slot ``i`` means GPU ``i % n_gpus``; a finished trial's slot
    goes to the next one, so the running trials stay spread evenly over the GPUs.
    """
    free: queue.SimpleQueue[int] = queue.SimpleQueue()
    for slot in range(plan.slots):
        free.put(slot)
    stopped = threading.Event()

    def run(trial: Trial, command: list[str]) -> Outcome:
        if stopped.is_set():  # taken from the queue just as the sweep stopped
            raise CancelledError
        slot = free.get()  # never waits: there are as many threads as slots
        try:
            outcome = runner(trial, command, pin_gpu(env, slot, plan.n_gpus))
            if interrupted(outcome):  # set before the slot is freed: no next trial starts
                stopped.set()
            return outcome
        finally:
            free.put(slot)

    pool = ThreadPoolExecutor(max_workers=plan.slots, thread_name_prefix="sweep-trial")
    try:
        futures = [pool.submit(run, trial, command) for trial, command in jobs]
        for future in as_completed(futures):
            outcome = future.result()
            yield outcome
            if interrupted(outcome):
                raise KeyboardInterrupt
    finally:
        # On Ctrl-C the running children got SIGINT too (same process group) and stop on their own;
        # trials not started yet must not start. Not waiting here lets KeyboardInterrupt reach main.
        stopped.set()
        pool.shutdown(wait=False, cancel_futures=True)
