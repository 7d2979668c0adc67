"""Env-only stepping per CW10 task: EnvPool's native MetaWorld v3 against the official envs, in one run.

Both backends build the task with the run's protocol (CW: 200-step episodes, goal-observable,
``is_success`` and episode infos): the official envs through ``make_vec_env``, EnvPool through
its adapter directly, so the tasks a run keeps on the official envs (not in ``ENVPOOL_VERIFIED``:
hammer, shelf-place, peg-unplug-side) are timed on EnvPool too, and marked. 8 envs, uniform random
actions, one thread for the pool and for torch. Rounds alternate between the backends and the
median steps/s is reported, so machine load hits both alike. Prints steps/s per task, the ratio
EnvPool / official, and the mean ratio over the tasks (target >= 2x).

    OMP_NUM_THREADS=1 python benchmarks/env_backends.py [--steps 4000] [--rounds 3] [--tasks hammer-v3 ...]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from rl_moe.envs.backend_check import backend_env
from rl_moe.envs.envpool_env import ENVPOOL_VERIFIED
from rl_moe.continual.resolve import RunRequest, resolve, suite_of


def _rate(task, suite, backend: str, n_envs: int, steps: int, rng: np.random.Generator) -> float:
    env = backend_env(suite, task, backend, n_envs, 0)
    try:
        env.reset()
        actions = rng.uniform(-1, 1, size=(steps // n_envs, n_envs, 4)).astype(np.float32)
        begin = time.perf_counter()
        for a in actions:
            env.step(a)
        return steps / (time.perf_counter() - begin)
    finally:
        env.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=4000, help="env steps per measurement (all envs together)")
    p.add_argument("--n-envs", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tasks", nargs="*", default=None, help="CW10 task names (default: all ten)")
    args = p.parse_args()

    suite = suite_of(resolve(RunRequest(suite="cw10", method="topk", vec_env="dummy")))
    tasks = [t for t in suite.tasks if args.tasks is None or t.name in args.tasks]
    rng = np.random.default_rng(0)
    rates = {(t.name, b): [] for t in tasks for b in ("official", "envpool")}
    for _ in range(args.rounds):
        for t in tasks:
            for b in ("official", "envpool"):
                rates[t.name, b].append(_rate(t, suite, b, args.n_envs, args.steps, rng))
    print(f"CW10 env stepping: {args.n_envs} envs, random actions, {args.steps} steps, median of {args.rounds} rounds, 1 thread")
    print(f"  {'task':<22} {'official':>9} {'envpool':>9}  ratio")
    ratios = []
    for t in tasks:
        off, ep = statistics.median(rates[t.name, "official"]), statistics.median(rates[t.name, "envpool"])
        ratios.append(ep / off)
        note = "" if t.name in ENVPOOL_VERIFIED else "  (runs use the official env: not equivalent)"
        print(f"  {t.name:<22} {off:9.0f} {ep:9.0f}  {ep / off:.2f}x{note}")
    print(f"mean ratio envpool / official = {statistics.mean(ratios):.2f}x (target >= 2x)")


if __name__ == "__main__":
    main()
