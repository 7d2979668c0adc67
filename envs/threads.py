"""CPU threads of one run: torch's intra-op pool and the native env pool take turns on the cores.

PPO with EnvPool in sync mode alternates: the pool's threads step the envs while Python waits for
them, then torch computes the next actions (or the update) while the pool's threads sleep. So a
run that may use N cores gives both N threads and never has more than N threads computing at once.

- ``--threads N``: the run uses N cores: torch gets N threads, an EnvPool backend N workers (at
  most one per env). The sweep passes ``--threads`` = its ``--cpus-per-trial`` (default 1).
- ``--threads auto`` (the CLI default), for a run that has the machine: with EnvPool, torch gets
  :data:`AUTO_TORCH_THREADS` threads (at most the cores) and the pool every core (at most one per
  env); with the official envs, which step in Python's own thread, torch gets 1.

Measured on the 2-core machine (benchmarks/README.md, "Env backends and threads"): with EnvPool,
two torch threads and two pool workers ran a whole CW10 PPO run 1.34x as fast as today's default
(official envs, 1 thread); one and one, 1.19x.
"""

from __future__ import annotations

import os

from rl_moe.errors import UsageError

#: Torch threads under ``--threads auto`` with EnvPool: 2 beat 1 by 1.2-1.3x on the 2-core
#: machine (the MoE update is the larger part of a PPO iteration there).
AUTO_TORCH_THREADS = 2


def available_cores() -> int:
    """CPUs this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def parse_threads(value: str) -> int | None:
    """``--threads``: a positive int, or None for ``auto``; :class:`UsageError` otherwise."""
    if value == "auto":
        return None
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise UsageError(f"--threads must be a positive integer or auto, got {value!r}")
    return n


def split_threads(torch_threads: int | None, vec_env: str, n_envs: int, cores: int | None = None) -> tuple[int, int]:
    """``(torch threads, env pool workers)`` for a run with ``n_envs`` envs on ``vec_env``; the
    pool number is 0 for backends without worker threads.

    :param torch_threads: ``--threads`` as parsed (None: auto)
    :param cores: CPUs available (default: this process's affinity)
    """
    cores = available_cores() if cores is None else cores
    native = vec_env == "envpool"
    if torch_threads is None:
        torch_n = max(1, min(AUTO_TORCH_THREADS, cores)) if native else 1
        budget = cores
    else:
        torch_n = budget = torch_threads
    return torch_n, max(1, min(n_envs, budget)) if native else 0
