"""CPU threads of one run: torch's intra-op pool and the native env pool take turns on the cores.

PPO with EnvPool in sync mode alternates: the pool's threads step the envs while Python waits for
them, then torch computes the next actions (or the update) while the pool's threads sleep. So a
run that may use N cores gives both N threads and never has more than N threads computing at once.

- ``--threads N``: the run uses N cores: torch gets N threads, an EnvPool backend N workers (at
  most one per env). The sweep passes ``--threads`` = its ``--cpus-per-trial`` (default 1).
- ``--threads auto`` (the CLI default): torch gets 1 thread for every task that steps on the
  official envs (they step in Python's own thread), also in a run whose other tasks use EnvPool.
  On a task that steps on EnvPool, torch gets :data:`AUTO_TORCH_THREADS` threads while the cores
  other processes keep busy (the 1-minute load average less this process's own share) leave that
  many free, else 1, checked again before every rollout; the pool gets every core (at most one
  per env). An ``OMP_NUM_THREADS`` the user set is kept as torch's thread count; ``--threads N``
  that differs from it says so in one line.

Why: two OpenMP threads on two cores that another process also wants wait on each other at
every parallel region; a CLI run beside other jobs took 18x as long with 2 torch threads as with 1
(benchmarks/README.md, "`threads_under_load.py`"). On an idle machine, with EnvPool, two
torch threads and two pool workers ran a whole CW10 PPO run 1.34x as fast as the official envs on
1 thread; one and one, 1.19x.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from stable_baselines3.common.callbacks import BaseCallback

from rl_moe.envs.factories import may_pool
from rl_moe.errors import UsageError

#: Torch threads under ``--threads auto`` with EnvPool: 2 beat 1 by 1.2-1.3x on the 2-core
#: machine (the MoE update is the larger part of a PPO iteration there).
AUTO_TORCH_THREADS = 2


#: Where Linux says which control groups a process is in, and where their files are mounted.
PROC_CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _quota_at(group: Path) -> float | None:
    """CPUs one control group's own quota allows: cgroup v2's ``cpu.max`` ("max 100000": none;
    "150000 100000": 1.5), else v1's ``cpu.cfs_quota_us`` (-1: none) over ``cpu.cfs_period_us``."""
    v2 = _read(group / "cpu.max")
    if v2 is not None:
        quota, period = (v2.split() + ["", ""])[:2]
    else:
        quota, period = _read(group / "cpu.cfs_quota_us") or "", _read(group / "cpu.cfs_period_us") or ""
    try:
        q, p = int(quota), int(period)
    except ValueError:  # "max", or no such files
        return None
    return q / p if q > 0 and p > 0 else None


def cgroup_cpu_quota(proc_cgroup: Path = PROC_CGROUP, root: Path = CGROUP_ROOT) -> float | None:
    """CPUs this process's control groups allow: the tightest quota over its group and the groups
    above it, under cgroup v2 or v1's ``cpu`` controller; None where none sets one (or not Linux)."""
    text = _read(proc_cgroup)
    if text is None:
        return None
    groups: list[Path] = []
    for line in text.splitlines():
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":  # v2: one hierarchy, mounted at the root (or beside v1 as "unified")
            mounts = [root, root / "unified"]
        elif "cpu" in controllers.split(","):
            mounts = [root / controllers, root / "cpu"]
        else:
            continue
        inner = Path(path.strip().lstrip("/"))
        groups += [mount / level for mount in mounts for level in (inner, *inner.parents)]
    quotas = [q for g in dict.fromkeys(groups) if (q := _quota_at(g)) is not None]
    return min(quotas) if quotas else None


def available_cores() -> int:
    """CPUs this process may run on: its affinity mask, not the machine's count, capped by its
    control groups' CPU quota rounded down (a container given 1.5 CPUs counts 1: threads beyond a
    quota are throttled, not run)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    return cores if quota is None else max(1, min(cores, math.floor(quota)))


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
    :param cores: CPUs available (default: :func:`available_cores`)
    """
    cores = available_cores() if cores is None else cores
    native = may_pool(vec_env)
    if torch_threads is None:
        torch_n = max(1, min(AUTO_TORCH_THREADS, cores)) if native else 1
        budget = cores
    else:
        torch_n = budget = torch_threads
    return torch_n, max(1, min(n_envs, budget)) if native else 0


def busy_cores() -> float:
    """Cores kept busy, by the 1-minute load average (0 where the OS has none)."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):  # not Unix
        return 0.0


def auto_torch_threads(cores: int, others: float) -> int:
    """Torch threads for a task on a native pool: :data:`AUTO_TORCH_THREADS` when ``cores`` less
    the ``others`` busy ones leave that many free, else 1."""
    free = cores - max(0.0, others)
    return max(1, min(AUTO_TORCH_THREADS, cores)) if free >= AUTO_TORCH_THREADS - 0.5 else 1


@dataclass
class ThreadPlan:
    """The torch threads of one run (``--threads``), per backend of the current task.

    :param auto: ``--threads auto``: choose per task and per update (module docstring)
    :param fixed: torch threads when not ``auto`` (``--threads N`` or the user's ``OMP_NUM_THREADS``)
    :param cores: CPUs this process may run on
    :param pool_threads: worker threads of a native pool (``--vec-env envpool``), from
        ``--threads`` (:func:`split_threads`)
    """

    auto: bool
    fixed: int = 1
    cores: int = 1
    pool_threads: int = 1

    def for_task(self, native: bool, others: float | None = None) -> int:
        """Torch threads for a task stepping on a native pool (``native``) or the official envs."""
        if not self.auto:
            return self.fixed
        if not native:
            return 1
        return auto_torch_threads(self.cores, busy_cores() if others is None else others)


def thread_plan(torch_threads: int | None, env: Mapping[str, str] | None = None, cores: int | None = None) -> tuple[ThreadPlan, str | None]:
    """The run's :class:`ThreadPlan` and a one-line note when ``--threads N`` overrides the user's
    ``OMP_NUM_THREADS`` (None otherwise; ``auto`` keeps it).

    :param torch_threads: ``--threads`` as parsed (None: auto)
    :param env: the environment (default: this process's)
    """
    env = os.environ if env is None else env
    cores = available_cores() if cores is None else cores
    omp = env.get("OMP_NUM_THREADS", "").strip()
    user = int(omp) if omp.isdigit() and int(omp) > 0 else None
    if torch_threads is None and user is not None:  # kept, not overridden: nothing to say
        return ThreadPlan(False, user, cores), None
    if torch_threads is None:
        return ThreadPlan(True, 1, cores), None
    note = f"note: --threads {torch_threads} overrides OMP_NUM_THREADS={user} for torch" if user is not None and user != torch_threads else None
    return ThreadPlan(False, torch_threads, cores), note


class LoadWatch:
    """This process's share of the load average, from its CPU time between two calls, so that
    :meth:`others` estimates the cores other processes keep busy."""

    def __init__(self) -> None:
        self._cpu, self._wall = self._now()

    @staticmethod
    def _now() -> tuple[float, float]:
        t = os.times()
        return t.user + t.system, time.monotonic()

    def others(self) -> float:
        cpu, wall = self._now()
        own = (cpu - self._cpu) / max(wall - self._wall, 1e-6)
        self._cpu, self._wall = cpu, wall
        return max(0.0, busy_cores() - own)


#: The plan of a run that leaves torch's threads alone (``fixed`` 0): library use and tests.
KEEP_THREADS = ThreadPlan(False, 0)


#: One per process: its own share is measured from one check to the next, across tasks.
_WATCH = LoadWatch()


class ThreadGovernor(BaseCallback):
    """Sets torch's threads for a task by the run's plan: at the task's start, and under ``auto``
    on a native pool again before every rollout and every update (a process that started beside
    the run takes the second thread back within a minute of load average).

    :param plan: the run's plan
    :param native: the task steps on a native pool (EnvPool), not the official envs
    """

    def __init__(self, plan: ThreadPlan, native: bool) -> None:
        super().__init__()
        self.plan, self.native = plan, native

    def _set(self, n: int) -> None:
        if n > 0 and torch.get_num_threads() != n:
            torch.set_num_threads(n)

    def _on_training_start(self) -> None:
        self._set(self.plan.for_task(self.native, _WATCH.others() if self.plan.auto and self.native else None))

    def _on_rollout_start(self) -> None:
        self._check()

    def _on_rollout_end(self) -> None:
        # Before the update too: a process that starts during a rollout would otherwise share the
        # cores with two torch threads for a whole update (an update of push-wall ran 11.5 min
        # that way beside two jobs, against about 25 s idle).
        self._check()

    def _check(self) -> None:
        if self.plan.auto and self.native:
            self._set(self.plan.for_task(True, _WATCH.others()))

    def _on_step(self) -> bool:
        return True
