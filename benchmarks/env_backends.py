"""Env-only stepping per CW10 task, in one run: the official envs plain and on the fast path
(rl_moe.envs.metaworld_fast), MuJoCo's physics alone, and optionally EnvPool.

Every backend builds the task with the suite's protocol (default ``cw10-paper``: fixed positions,
500-step episodes) through the run's own factories and ``DummyVecEnv``, 8 envs, uniform random
actions, one thread. The physics floor is the time spent inside ``mujoco.mj_step`` (``frame_skip``
substeps per env step) during the fast-path rounds, so it is the same trajectories' physics.
Rounds alternate between the backends and the median is reported, so machine load hits all alike.

Prints per task: steps/s of each backend, fast / plain, and how far the fast path still is from its
physics floor; then the CW10 mean time per step of each, the run's target lines (fast >= 3x plain
on the mean; per task >= 2x plain or within 1.5x of the floor).

    OMP_NUM_THREADS=1 python benchmarks/env_backends.py [--suite cw10-paper] [--steps 4000] [--rounds 3] [--envpool] [--tasks hammer-v3 ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import mujoco
import numpy as np

from rl_moe.envs.backend_check import backend_env
from rl_moe.envs.families import METAWORLD_FAST_VAR
from rl_moe.envs.suites import load_suite


class _PhysicsClock:
    """Wraps ``mujoco.mj_step`` while active and sums the seconds spent inside it."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._original = mujoco.mj_step

    def __enter__(self) -> _PhysicsClock:
        original = self._original

        def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            out = original(*args, **kwargs)
            self.seconds += time.perf_counter() - t0
            return out

        mujoco.mj_step = timed
        return self

    def __exit__(self, *exc: object) -> None:
        mujoco.mj_step = self._original


def _seconds_per_step(suite, task, backend: str, n_envs: int, steps: int, rng: np.random.Generator) -> tuple[float, float]:
    """(wall seconds per env step, of which inside ``mj_step``) for one backend."""
    os.environ[METAWORLD_FAST_VAR] = "0" if backend == "plain" else "1"
    env = backend_env(suite, task, "envpool" if backend == "envpool" else "official", n_envs, 0)
    try:
        env.reset()
        actions = rng.uniform(-1, 1, size=(steps // n_envs, n_envs, 4)).astype(np.float32)
        with _PhysicsClock() as clock:
            begin = time.perf_counter()
            for a in actions:
                env.step(a)
            wall = time.perf_counter() - begin
        n = len(actions) * n_envs
        return wall / n, clock.seconds / n
    finally:
        env.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", default="cw10-paper")
    p.add_argument("--steps", type=int, default=4000, help="env steps per measurement (all envs together)")
    p.add_argument("--n-envs", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--envpool", action="store_true", help="also time EnvPool (it cannot keep positions fixed: a speed reference only)")
    p.add_argument("--tasks", nargs="*", default=None, help="task names (default: the suite's ten)")
    args = p.parse_args()

    suite = load_suite(args.suite)
    tasks = [t for t in suite.tasks if args.tasks is None or t.name in args.tasks]
    backends = ["plain", "fast"] + (["envpool"] if args.envpool else [])
    rng = np.random.default_rng(0)
    wall: dict[tuple[str, str], list[float]] = {(t.name, b): [] for t in tasks for b in backends}
    physics: dict[str, list[float]] = {t.name: [] for t in tasks}
    for _ in range(args.rounds):
        for t in tasks:
            for b in backends:
                w, ph = _seconds_per_step(suite, t, b, args.n_envs, args.steps, rng)
                wall[t.name, b].append(w)
                if b == "fast":
                    physics[t.name].append(ph)
    med = {k: statistics.median(v) for k, v in wall.items()}
    floor = {k: statistics.median(v) for k, v in physics.items()}
    print(f"{suite.name} env stepping: {args.n_envs} envs (DummyVecEnv), random actions, {args.steps} steps, median of {args.rounds} rounds, 1 thread")
    head = f"  {'task':<22} {'plain':>7} {'fast':>7}" + (f" {'envpool':>8}" if args.envpool else "") + f" {'mj_step':>8}  fast/plain  fast/floor  target"
    print(head + "\n  (steps/s; fast/floor is the fast path's time per step over its mj_step time)")
    met = []
    for t in tasks:
        plain, fast, ph = med[t.name, "plain"], med[t.name, "fast"], floor[t.name]
        speed, gap = plain / fast, fast / ph
        ok = speed >= 2.0 or gap <= 1.5
        met.append(ok)
        pool = f" {1 / med[t.name, 'envpool']:8.0f}" if args.envpool else ""
        print(f"  {t.name:<22} {1 / plain:7.0f} {1 / fast:7.0f}{pool} {1 / ph:8.0f}  {speed:9.2f}x  {gap:9.2f}x  {'met' if ok else 'not met'}")
    mean = {b: statistics.mean(med[t.name, b] for t in tasks) for b in backends}
    mean_floor = statistics.mean(floor.values())
    print(f"mean time per step: plain {mean['plain'] * 1e3:.3f} ms, fast {mean['fast'] * 1e3:.3f} ms, mj_step floor {mean_floor * 1e3:.3f} ms"
          + (f", envpool {mean['envpool'] * 1e3:.3f} ms" if args.envpool else ""))  # fmt: skip
    print(f"fast / plain on the mean time per step = {mean['plain'] / mean['fast']:.2f}x (target >= 3x); "
          f"fast / floor = {mean['fast'] / mean_floor:.2f}x; per-task target met on {sum(met)} of {len(met)}")  # fmt: skip


if __name__ == "__main__":
    main()
