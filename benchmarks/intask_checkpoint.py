"""The in-task checkpoint's cost as a share of training time, at the default interval, in one run.

A Top-K MoE PPO learner with the paper's MetaWorld settings (8 official envs x 2048 steps, 10
epochs, E=10 3x256 experts) trains one rollout-plus-update cycle on a CW10 task; then the
boundary capture (every cycle) and the write (one per ``checkpoint.every_steps``) are timed on
that learner. Prints the per-cycle share of each and the total (target <= 1%).

    OMP_NUM_THREADS=1 python benchmarks/intask_checkpoint.py [--task push-wall-v3] [--repeats 5]
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path

from rl_moe.continual import intask
from rl_moe.continual.agents import build_model
from rl_moe.continual.resolve import RunRequest, resolve, suite_of
from rl_moe.envs.factories import make_vec_env, task_factories


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="push-wall-v3")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    cfg = resolve(RunRequest(suite="cw10-cw", method="topk", vec_env="dummy", device="cpu"))
    suite = suite_of(cfg)
    task = next(t for t in suite.tasks if t.name == args.task)
    env = make_vec_env(task_factories(suite, task, cfg.ppo.n_envs, 0), "dummy")
    model = build_model(cfg, env, "cpu")
    rollout = cfg.ppo.n_envs * cfg.ppo.n_steps
    start = time.perf_counter()
    model.learn(rollout)  # one rollout and one update: the cycle a boundary ends
    cycle = time.perf_counter() - start
    curve = {"steps": [0], "success": [0.0], "return": [0.0]}
    captures, writes = [], []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "in_task.pkl"
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            state = intask.capture(model, env, 0, 0, curve, {"eval": {"next_eval": 0}, "probe": None}, 0.0)
            t1 = time.perf_counter()
            intask.write(path, state)
            t2 = time.perf_counter()
            captures.append(t1 - t0)
            writes.append(t2 - t1)
        size = path.stat().st_size
    env.close()
    cycles_per_write = math.ceil(cfg.checkpoint.every_steps / rollout)
    capture_share = statistics.median(captures) / cycle
    write_share = statistics.median(writes) / (cycles_per_write * cycle)
    print(f"{args.task}: cycle of {rollout:,} steps {cycle:.1f}s; checkpoint {size / 1e6:.1f} MB, written every {cycles_per_write} cycles ({cfg.checkpoint.every_steps:,} steps)")
    print(f"  capture at every boundary: {100 * capture_share:.3f}% of training time")
    print(f"  write at the default interval: {100 * write_share:.3f}%")
    print(f"  total: {100 * (capture_share + write_share):.3f}% (target <= 1%)")


if __name__ == "__main__":
    main()
