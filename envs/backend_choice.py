"""``--vec-env auto``: each task trains on the env backend that steps fastest here and now.

EnvPool steps most CW10 tasks 2-5x faster than the official envs on an idle machine, but an early
measurement on an oversubscribed machine (load about 4, before the thread governor) had a
faucet-close run take 307 s on EnvPool against 67 s on the official envs. So ``auto`` does not
assume: at the start of each task it builds every
backend that serves the task faithfully, steps each with the same random actions in alternating
rounds, and trains on the fastest. The candidates are the official in-process envs (on the
MetaWorld fast path where it is on), the native pool with the run's workers, and the pool with one
worker. About 3 x 3 x 512 env steps: a few seconds of a task's half hour.

The choice is recorded with its measured rates in results.json (``provenance``); a resume inside a
task keeps the backend the task started on. Evaluation does not depend on it (it uses the pool
wherever the pool serves the task), so success numbers stay comparable across loads. Training does:
pass ``--vec-env dummy`` or ``envpool`` for a run that must repeat bit for bit.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from stable_baselines3.common.vec_env import VecEnv

from rl_moe.envs import envpool_env
from rl_moe.envs.factories import EnvFactory, make_vec_env
from rl_moe.envs.families import FAMILIES
from rl_moe.envs.suite_spec import TaskSpec


@dataclass(frozen=True)
class Candidate:
    """One backend for a task's training envs.

    :param vec_type: ``dummy`` (the official envs in this process) or ``envpool``
    :param workers: the pool's worker threads (0 in-process)
    """

    vec_type: str
    workers: int = 0

    @property
    def label(self) -> str:
        return self.vec_type if self.vec_type != "envpool" else f"envpool/{self.workers}"


#: The official in-process envs: always a candidate, and the choice on a tie.
OFFICIAL = Candidate("dummy")


@dataclass(frozen=True)
class BackendChoice:
    """The backend a task trains on and what was measured to choose it (empty: nothing to choose)."""

    chosen: Candidate
    rates: Mapping[str, float] = field(default_factory=dict)
    seconds: float = 0.0  # the measurement's wall time, envs built and closed included

    def record(self) -> dict[str, Any]:
        """The provenance entry's fields: the pool's workers, the measured env steps/s and the
        measurement's seconds."""
        out: dict[str, Any] = {"pool_workers": self.chosen.workers}
        if self.rates:
            out["backend_rates"] = {k: round(v, 1) for k, v in self.rates.items()}
            out["backend_seconds"] = round(self.seconds, 2)
        return out

    def note(self, task: str) -> str | None:
        """One line for stderr naming the choice against the other candidates (None: no choice)."""
        if len(self.rates) < 2:
            return None
        others = ", ".join(f"{k} {v:,.0f}" for k, v in self.rates.items() if k != self.chosen.label)
        return f"note: {task} trains on {self.chosen.label}: {self.rates[self.chosen.label]:,.0f} env steps/s measured here (against {others})"


def pool_serves(task: TaskSpec, family: str) -> bool:
    """Whether ``family``'s native pool serves ``task`` faithfully (installed or not)."""
    fam = FAMILIES[family]
    return fam.pool is not None and (fam.pool_refusal is None or fam.pool_refusal(task) is None)


def candidates(factories: Sequence[EnvFactory], pool_workers: int) -> list[Candidate]:
    """The backends that serve the task of ``factories`` faithfully, the official envs first.

    :param pool_workers: the run's pool workers (``--threads``); the pool also runs on one
    """
    first = factories[0]
    if not envpool_env.envpool_installed() or not pool_serves(first.task, first.family):
        return [OFFICIAL]
    workers = sorted({max(1, min(pool_workers, len(factories))), 1}, reverse=True)
    return [OFFICIAL, *(Candidate("envpool", w) for w in workers)]


def pick(rates: Mapping[Candidate, float]) -> Candidate:
    """The fastest candidate; on a tie the first (so the official envs over the pool)."""
    return max(rates, key=lambda c: rates[c])  # max keeps the first of equal keys


def _stepper(env: VecEnv, seed: int) -> Any:
    rng = np.random.default_rng(seed)
    low, high = env.action_space.low, env.action_space.high
    env.reset()

    def step(n: int) -> float:
        actions = rng.uniform(low, high, size=(n, env.num_envs, *low.shape)).astype(np.float32)
        t0 = time.perf_counter()
        for a in actions:
            env.step(a)
        return time.perf_counter() - t0

    return step


def measure_rates(factories: Sequence[EnvFactory], cands: Sequence[Candidate], vec_steps: int = 64, rounds: int = 3, seed: int = 0) -> dict[Candidate, float]:
    """Env steps/s of each candidate: the median of ``rounds`` alternating rounds of ``vec_steps``
    vectorized steps with uniform random actions, after one untimed warm-up step each. The envs
    are built here and closed: training builds its own, untouched by this."""
    envs: dict[Candidate, VecEnv] = {}
    try:
        for c in cands:  # one at a time inside the try: a build that fails closes the others
            envs[c] = make_vec_env(list(factories), c.vec_type, c.workers)
        steppers = {c: _stepper(env, seed) for c, env in envs.items()}
        for s in steppers.values():
            s(1)
        times: dict[Candidate, list[float]] = {c: [] for c in cands}
        for _ in range(rounds):
            for c in cands:
                times[c].append(steppers[c](vec_steps))
    finally:
        for env in envs.values():
            env.close()
    return {c: vec_steps * len(factories) / max(statistics.median(t), 1e-9) for c, t in times.items()}


def choose_backend(factories: Sequence[EnvFactory], pool_workers: int, vec_steps: int = 64, rounds: int = 3) -> BackendChoice:
    """The backend the task of ``factories`` trains on under ``--vec-env auto`` (module docstring)."""
    cands = candidates(factories, pool_workers)
    if len(cands) == 1:
        return BackendChoice(cands[0])
    t0 = time.perf_counter()
    rates = measure_rates(factories, cands, vec_steps, rounds)
    return BackendChoice(pick(rates), {c.label: r for c, r in rates.items()}, time.perf_counter() - t0)


def recorded_backend(provenance: Sequence[Mapping[str, Any]], task: int, pool_workers: int) -> BackendChoice | None:
    """The backend task ``task`` last ran on, from results.json's ``provenance`` (None: never
    started). The backend is what makes a rerun the same run; its workers stay within the
    ``pool_workers`` of this session's ``--threads``."""
    entry = next((p for p in reversed(provenance) if p.get("task") == task), None)
    if entry is None:
        return None
    if str(entry.get("backend", "")).startswith("envpool"):
        return BackendChoice(Candidate("envpool", max(1, min(int(entry.get("pool_workers", 1)), pool_workers))))
    return BackendChoice(OFFICIAL)
