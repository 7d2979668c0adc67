"""A ``cw10`` slice task's speed in one run: this checkout against a baseline commit, the update's
share of this core's matmul peak, and a Top-K task against SB3's PPO ``MlpPolicy`` 3 × 256.

1. **Against a baseline commit.** Two worker processes, one importing this checkout's ``rl_moe``
   and one a baseline checkout's (``--baseline``, e.g. a ``git worktree`` of the commit before a
   change), each build Top-K + SPHERE as ``python -m rl_moe.crl --suite cw10 --method sphere``
   does (the suite's default network and λ arithmetic, 8 envs on the fast path) and run
   rollout-plus-update cycles when told. The parent alternates them a b b a over ``--rounds``
   cycles per task, so the neighbours' load hits both alike, and prints the ratio new / baseline
   of the whole cycle and of each part (env stepping, acting, the update with SPHERE). Goal ≤ 0.5.
2. **The update's share of the matmul peak**: the update's matrix-product FLOP (torch's profiler)
   over its seconds in this checkout's worker, against the 1024² fp32 matmul rate measured in the
   same run. Goal ≥ 0.70.
3. **Against SB3**: ``vs_sb3.py``'s comparison (Top-K, no SPHERE), SB3's time over ours. Goal ≥ 1.0.

    git worktree add --detach /tmp/rl_moe-base <commit>
    OMP_NUM_THREADS=1 python benchmarks/task_speed.py --baseline /tmp/rl_moe-base [--tasks hammer-v3 push-wall-v3] [--rounds 4]

The workers use only what every commit since the slice's has (``resolve``, ``build_model``,
``begin_task``, the envs' factories), so any later commit can be compared with it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PARTS = ("env", "acting", "update")

sys.path.insert(0, str(HERE))
from _workers import ROOT, alternated, baseline_pair, check_baseline, describe  # noqa: E402  (a sibling module of this script)


def _worker(task_name: str, n_steps: int) -> None:
    """Build the SPHERE learner from whichever ``rl_moe`` is first on the path, then run one
    rollout-plus-update cycle per ``cycle`` line on stdin and print its seconds as JSON."""
    import torch

    import rl_moe
    from rl_moe.continual.agents import begin_task, build_model
    from rl_moe.continual.resolve import RunRequest, resolve, suite_of
    from rl_moe.envs.factories import make_vec_env, task_factories

    torch.set_num_threads(1)
    cfg = resolve(RunRequest(suite="cw10", method="sphere", tasks=10, vec_env="dummy", device="cpu", overrides=(f"ppo.n_steps={n_steps}",)))
    suite = suite_of(cfg)
    task = next(t for t in suite.tasks if t.name == task_name)
    env = make_vec_env(task_factories(suite, task, cfg.ppo.n_envs, 0), "dummy")
    model = build_model(cfg, env, "cpu")
    begin_task(model, cfg, 0, 0)
    steps = env.num_envs * n_steps
    clock = {"env": 0.0, "update": 0.0}
    step, train = env.step, model.train

    def timed_step(actions):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        out = step(actions)
        clock["env"] += time.perf_counter() - t0
        return out

    def timed_train() -> None:
        t0 = time.perf_counter()
        train()
        clock["update"] += time.perf_counter() - t0

    env.step, model.train = timed_step, timed_train
    model.learn(steps, reset_num_timesteps=False)  # warm-up: first forward, allocations
    print(json.dumps({"ready": str(Path(rl_moe.__file__).parent)}), flush=True)
    for line in sys.stdin:
        if line.strip() == "flop":
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_flops=True) as prof:
                train()
            print(json.dumps({"flop": float(sum(e.flops for e in prof.key_averages() if e.flops))}), flush=True)
            continue
        clock["env"] = clock["update"] = 0.0
        t0 = time.perf_counter()
        model.learn(steps, reset_num_timesteps=False)
        total = time.perf_counter() - t0
        print(json.dumps({"env": clock["env"], "acting": total - clock["env"] - clock["update"], "update": clock["update"]}), flush=True)


def _against_baseline(baseline: Path, task: str, rounds: int, n_steps: int) -> tuple[dict[str, float], float]:
    """Medians per part of (new / baseline) over alternated cycles, and the new update's FLOP/s."""
    args = ["--tasks", task, "--n-steps", str(n_steps)]
    new, base = baseline_pair(baseline, "task_speed.py", args)
    samples = alternated(new, base, lambda w: w.ask("cycle"), rounds)
    flop = float(new.ask("flop")["flop"])
    new.close()
    base.close()
    med = {k: {part: statistics.median(s[part] for s in v) for part in PARTS} for k, v in samples.items()}
    for k in med:
        med[k]["task"] = sum(med[k][p] for p in PARTS)
    ratios = {part: med["new"][part] / med["base"][part] for part in (*PARTS, "task")}
    return ratios, flop / med["new"]["update"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", type=Path, help="a checkout of the commit to compare against (e.g. a git worktree)")
    p.add_argument("--tasks", nargs="+", default=["hammer-v3", "push-wall-v3"], help="two of the slice's tasks by default")
    p.add_argument("--rounds", type=int, default=4, help="cycles of each commit per task, alternated a b b a (>= 3)")
    p.add_argument("--n-steps", type=int, default=256, help="rollout length per env (8 envs; one minibatch per 25.6 env steps as in the paper)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        _worker(args.tasks[0], args.n_steps)
        return
    check_baseline(args.baseline)
    import torch

    sys.path.insert(0, str(HERE))
    from task_time_split import _matmul_peak
    from vs_sb3 import measure

    torch.set_num_threads(1)
    base_commit, new_commit = describe(args.baseline), describe(ROOT)
    print(f"cw10 slice tasks, 1 thread, {args.rounds} alternated cycles of {8 * args.n_steps:,} env steps and one update per variant; "
          f"this checkout {new_commit} against {base_commit} ({args.baseline})")  # fmt: skip
    for task in args.tasks:
        ratios, flops = _against_baseline(args.baseline, task, args.rounds, args.n_steps)
        peak = _matmul_peak()
        sb3 = measure(task, args.rounds, args.n_steps)
        print(f"{task}:")
        print("  new / baseline, Top-K + SPHERE (goal <= 0.5): " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()))
        print(f"  the update's matrix products at {flops / 1e9:.1f} GFLOP/s, {flops / peak:.2f} of the 1024² peak ({peak / 1e9:.1f} GFLOP/s) (goal >= 0.70)")
        print(f"  SB3 MlpPolicy 3 × 256 / ours, Top-K without SPHERE (goal >= 1.0): task {sb3['task'][1] / sb3['task'][0]:.2f}, "
              + ", ".join(f"{k} {sb3[k][1] / sb3[k][0]:.2f}" for k in PARTS))  # fmt: skip


if __name__ == "__main__":
    main()
