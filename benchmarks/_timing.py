"""Interleaved timing so that machine noise hits every variant alike; ratios are what we report.
Also the length of a paper task, onto which short measurements are projected."""

from __future__ import annotations

import functools
import statistics
import time
from typing import Callable


def interleaved_medians(
    fns: dict[str, Callable[[], None]], rounds: int = 15, inner: int = 5, warmup: int = 3, clock: Callable[[], float] = time.perf_counter
) -> dict[str, float]:
    """Median seconds per call of each function, measured in alternating rounds on ``clock``
    (wall time by default; ``time.thread_time`` counts only this thread's time on the core)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = clock()
            for _ in range(inner):
                fn()
            samples[name].append((clock() - t0) / inner)
    return {k: statistics.median(v) for k, v in samples.items()}


def best_seconds(fn: Callable[[], object], reps: int, rounds: int, clock: Callable[[], float] = time.thread_time) -> float:
    """Seconds per call of ``fn`` in the best of ``rounds`` rounds of ``reps`` calls, after one
    warm-up call: a rate of this core, where a shared core's slower rounds measure the neighbours."""
    fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = clock()
        for _ in range(reps):
            fn()
        best = min(best, (clock() - t0) / reps)
    return best


@functools.cache
def paper_task_steps() -> int:
    """Env steps of one task of the paper's CW10 protocol as a run trains it: 1M asked, rounded up
    to whole PPO rollouts by the config's own rule (1,015,808 at 8 x 2048)."""
    from rl_moe.continual.resolve import RunRequest, resolve  # lazy: most benchmarks only time

    return resolve(RunRequest(suite="cw10", device="cpu")).effective_steps_per_task

