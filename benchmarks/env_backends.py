"""Env-only stepping per CW10 task, in one run: the official envs plain and on the fast path
(rl_moe.envs.metaworld_fast), MuJoCo's physics alone, and optionally EnvPool.

Every backend builds the task with the suite's protocol (default ``cw10-paper``: fixed positions,
500-step episodes) through the run's own factories and ``DummyVecEnv``, 8 envs, uniform random
actions, one thread. The physics floor is the time spent inside ``mujoco.mj_step`` (``frame_skip``
substeps per env step) during the fast-path rounds, so it is the same trajectories' physics.
Rounds alternate between the backends and the median is reported, so machine load hits all alike.

Prints per task: steps/s of each backend, fast / plain, and how far the fast path still is from its
physics floor; then the CW10 mean time per step of each, the run's target lines (fast >= 3x plain
on the mean; per task >= 2x plain or within 1.5x of the floor). ``--split`` adds, per task, the
shares of a fast-path step: ``mj_step``, the rest of MuJoCo (``mj_forward``,
``mj_rnePostConstraint``), the reward (``evaluate_state``), the observation (``_get_obs``), the
action (``set_xyz_action``) and the rest (the step's own code and the wrapper layers).

    OMP_NUM_THREADS=1 python benchmarks/env_backends.py [--suite cw10-paper] [--steps 4000] [--rounds 3] [--envpool] [--tasks hammer-v3 ...] [--split]
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


#: The parts of a fast-path step the split names: MuJoCo functions (swapped on the module) and
#: methods of the MetaWorld env (shadowed on each instance). They never call one another, so the
#: rest of the step's time is the step's own code, the site updates, the observation clip and the
#: gymnasium / SB3 wrapper layers.
MUJOCO_PARTS: dict[str, tuple[str, ...]] = {"mj_step": ("mj_step",), "other MuJoCo": ("mj_forward", "mj_rnePostConstraint")}
ENV_PARTS: dict[str, str] = {"reward": "evaluate_state", "observation": "_get_obs", "action": "set_xyz_action"}


def _timed(fn, seconds: dict[str, float], label: str):  # type: ignore[no-untyped-def]
    def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        seconds[label] += time.perf_counter() - t0
        return out

    return timed


class _Clocks:
    """While active, sums the seconds spent inside MuJoCo's :data:`MUJOCO_PARTS` and, with
    ``envs`` given, inside each env's :data:`ENV_PARTS` (``mj_step`` alone is the physics floor)."""

    def __init__(self, envs: list | None = None) -> None:
        self.envs = envs or []
        self.seconds = {k: 0.0 for k in [*MUJOCO_PARTS, *(ENV_PARTS if envs else ())]}
        self._originals = {name: getattr(mujoco, name) for names in MUJOCO_PARTS.values() for name in names}

    def __enter__(self) -> _Clocks:
        for label, names in MUJOCO_PARTS.items():
            for name in names:
                setattr(mujoco, name, _timed(self._originals[name], self.seconds, label))
        for env in self.envs:
            for label, name in ENV_PARTS.items():
                setattr(env, name, _timed(getattr(env, name), self.seconds, label))
        return self

    def __exit__(self, *exc: object) -> None:
        for name, fn in self._originals.items():
            setattr(mujoco, name, fn)
        for env in self.envs:
            for name in ENV_PARTS.values():
                del env.__dict__[name]


def _seconds_per_step(suite, task, backend: str, n_envs: int, steps: int, rng: np.random.Generator, split: bool = False) -> tuple[float, dict[str, float]]:
    """(wall seconds per env step, seconds per env step inside each timed part) for one backend."""
    os.environ[METAWORLD_FAST_VAR] = "0" if backend == "plain" else "1"
    env = backend_env(suite, task, "envpool" if backend == "envpool" else "official", n_envs, 0)
    try:
        env.reset()
        actions = rng.uniform(-1, 1, size=(steps // n_envs, n_envs, 4)).astype(np.float32)
        raws = [e.unwrapped for e in env.envs] if split else None
        with _Clocks(raws) as clocks:
            begin = time.perf_counter()
            for a in actions:
                env.step(a)
            wall = time.perf_counter() - begin
        n = len(actions) * n_envs
        return wall / n, {k: v / n for k, v in clocks.seconds.items()}
    finally:
        env.close()


def print_split(tasks: list, wall: dict[str, float], parts: dict[str, dict[str, float]]) -> None:
    """Per task, the shares of a fast-path step: what stands between it and its mj_step floor."""
    labels = [*MUJOCO_PARTS, *ENV_PARTS, "rest"]
    print("\nwhere a fast-path step goes (share of its time; separate rounds with the parts timed, which adds a little to each)")
    print(f"  {'task':<22}" + "".join(f"{k:>14}" for k in labels) + "   largest beyond mj_step")
    for t in tasks:
        share = {k: v / wall[t.name] for k, v in parts[t.name].items()}
        share["rest"] = 1.0 - sum(share.values())
        beyond = max((k for k in labels if k != "mj_step"), key=lambda k: share[k])
        print(f"  {t.name:<22}" + "".join(f"{share[k]:>13.0%} " for k in labels) + f"   {beyond}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", default="cw10-paper")
    p.add_argument("--steps", type=int, default=4000, help="env steps per measurement (all envs together)")
    p.add_argument("--n-envs", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--envpool", action="store_true", help="also time EnvPool (it cannot keep positions fixed: a speed reference only)")
    p.add_argument("--tasks", nargs="*", default=None, help="task names (default: the suite's ten)")
    p.add_argument("--split", action="store_true", help="also time the parts of a fast-path step per task (extra rounds)")
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
                w, parts = _seconds_per_step(suite, t, b, args.n_envs, args.steps, rng)
                wall[t.name, b].append(w)
                if b == "fast":
                    physics[t.name].append(parts["mj_step"])
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
    if args.split:
        timed = {t.name: [_seconds_per_step(suite, t, "fast", args.n_envs, args.steps, rng, split=True) for _ in range(args.rounds)] for t in tasks}
        walls = {name: statistics.median(w for w, _ in runs) for name, runs in timed.items()}
        parts = {name: {k: statistics.median(p[k] for _, p in runs) for k in runs[0][1]} for name, runs in timed.items()}
        print_split(tasks, walls, parts)


if __name__ == "__main__":
    main()
