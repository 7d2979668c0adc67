"""A `cw10` task's env stepping on the MetaWorld fast path, this checkout against a baseline checkout.

Two worker processes, one importing this checkout's ``rl_moe`` and one a baseline's (``--baseline``,
a ``git worktree`` of the older commit), each build a task's training envs as
``python -m rl_moe.crl --suite cw10`` does (8 envs on the fast path in the run's in-process vec env,
fixed positions, 500-step episodes, so resets fall inside the rounds) and step them with the same
uniform random actions. Each round is ``--steps`` vec steps in thread CPU time; rounds alternate
a b b a and the ratio is the median of the per-pair ratios. Both workers' observations, rewards,
dones and infos are hashed per round and must be equal: the fast path is bit-identical, so the new
code must return the baseline's bytes. Last, one round per worker with ``mujoco.mj_step`` timed
gives the physics floor: the step's time over the time inside ``mj_step`` (the issue's goal for
stepping is 1.5x).

    git worktree add --detach /tmp/rl_moe-base <commit>
    OMP_NUM_THREADS=1 python benchmarks/step_speed.py --baseline /tmp/rl_moe-base [--tasks hammer-v3 ...] [--rounds 8] [--steps 500]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

sys.path.insert(0, str(HERE))
from _workers import ROOT, alternated, baseline_pair, check_baseline, describe  # noqa: E402  (a sibling module of this script)

#: The slice's tasks (docs/results.md §8).
SLICE = ["hammer-v3", "push-wall-v3", "faucet-close-v3"]


def _info_key(info: dict) -> list[tuple[str, str]]:  # type: ignore[type-arg]
    """An env's info as compared: SB3's Monitor adds the episode's wall time, which always differs."""
    episode = info.get("episode")
    kept = {**info, "episode": {k: v for k, v in episode.items() if k != "t"}} if episode else info
    return sorted((k, repr(v)) for k, v in kept.items())


def _worker(task_name: str, steps: int) -> None:
    """Build the task's training envs from whichever ``rl_moe`` is first on the path; per
    ``round R`` line step them ``steps`` times and print the thread seconds and a hash of what they
    returned; per ``floor`` line do the same with the seconds inside ``mujoco.mj_step``."""
    import mujoco

    import rl_moe.envs
    from rl_moe.continual.resolve import RunRequest, resolve, suite_of
    from rl_moe.envs.factories import make_vec_env, task_factories

    cfg = resolve(RunRequest(suite="cw10", tasks=10, vec_env="dummy", device="cpu"))
    suite = suite_of(cfg)
    task = next(t for t in suite.tasks if t.name == task_name)
    env = make_vec_env(task_factories(suite, task, cfg.ppo.n_envs, 0), "dummy")
    env.reset()
    inside = [0.0]
    original = mujoco.mj_step

    def timed_mj_step(*args, **kwargs):  # type: ignore[no-untyped-def]
        t0 = time.thread_time()
        original(*args, **kwargs)
        inside[0] += time.thread_time() - t0

    # the envs' folder: stepping is what this compares (_workers binds it to the worker's checkout)
    print(json.dumps({"ready": str(Path(rl_moe.envs.__file__).parent)}), flush=True)
    for r, line in enumerate(sys.stdin):
        actions = np.random.default_rng(r).uniform(-1, 1, (steps, env.num_envs, 4)).astype(np.float32)
        digest = hashlib.sha256()
        floor = line.strip() == "floor"
        inside[0] = 0.0
        if floor:
            mujoco.mj_step = timed_mj_step
        t0 = time.thread_time()
        for a in actions:
            obs, rewards, dones, infos = env.step(a)
            digest.update(obs.tobytes() + rewards.tobytes() + dones.tobytes() + repr([_info_key(i) for i in infos]).encode())
        seconds = time.thread_time() - t0
        mujoco.mj_step = original
        print(json.dumps({"seconds": seconds, "mj_step": inside[0], "hash": digest.hexdigest()}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", type=Path, help="a checkout of the commit to compare against (e.g. a git worktree)")
    p.add_argument("--tasks", nargs="+", default=SLICE)
    p.add_argument("--rounds", type=int, default=8, help="rounds per checkout and task, alternated a b b a")
    p.add_argument("--steps", type=int, default=500, help="vec steps (8 env steps each) per round")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--task", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        _worker(args.task, args.steps)
        return
    commit = {"new": describe(ROOT), "base": describe(check_baseline(args.baseline))}
    print(f"cw10 env stepping on the fast path: 8 envs, uniform random actions, {args.steps} vec steps per round, {args.rounds} alternated rounds, 1 thread")
    print(f"  this checkout {commit['new']} against the baseline {commit['base']}; thread CPU time")
    print(f"  {'task':<22} {'new / baseline':>15} {'per-round range':>16} {'new ms/vec step':>16} {'new / mj_step':>14} {'base / mj_step':>15}  trajectories")
    for task in args.tasks:
        new, base = baseline_pair(args.baseline, "step_speed.py", ["--task", task, "--steps", str(args.steps)])
        answers = alternated(new, base, lambda w: w.ask("round"), args.rounds)
        seconds = {name: [float(a["seconds"]) for a in got] for name, got in answers.items()}
        hashes = {name: [str(a["hash"]) for a in got] for name, got in answers.items()}
        floors = {"new": new.ask("floor"), "base": base.ask("floor")}
        new.close()
        base.close()
        pairs = [n / b for n, b in zip(seconds["new"], seconds["base"])]
        same = hashes["new"] == hashes["base"] and floors["new"]["hash"] == floors["base"]["hash"]
        over_floor = {name: statistics.median(seconds[name]) / float(f["mj_step"]) for name, f in floors.items()}
        print(
            f"  {task:<22} {statistics.median(pairs):>15.3f} {min(pairs):>7.3f}–{max(pairs):<8.3f} {1e3 * statistics.median(seconds['new']) / args.steps:>16.3f}"
            f" {over_floor['new']:>13.2f}x {over_floor['base']:>14.2f}x  {'equal bytes' if same else 'DIFFERENT'}"
        )


if __name__ == "__main__":
    main()
