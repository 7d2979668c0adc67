"""The cost of ``eval.clip_steps`` (a TensorBoard clip at each task's end), as a ratio to the
training it rides on, measured in one run.

Alternates, ``--rounds`` times: (a) one clip as the scheduler renders and logs it (a fresh hammer-v3
eval env, ``--steps`` deterministic steps of the slice network's policy, every ``--stride``-th frame
at ``--size``, GIF-encoded) and (b) one PPO iteration of the slice's network on hammer-v3 (8 envs x
``--rollout`` steps and its update, 10 epochs, batch 256). Both are thread CPU time on one torch
thread. A 1M-step task is 62 iterations of 2,048 steps; the clip's share of a task is
clip / (62 x iteration x 2,048 / rollout).

Run: ``MUJOCO_GL=osmesa python benchmarks/clip_cost.py [--steps 100] [--stride 4] [--size 160x120] [--rollout 256] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rl_moe.continual.agents import build_model
from rl_moe.continual.resolve import RunRequest, resolve, suite_of
from rl_moe.continual.run_view import RunView
from rl_moe.envs.factories import make_vec_env, task_factories
from rl_moe.recording import VideoSettings, clip, encode_gif


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--stride", type=int, default=4)
    p.add_argument("--size", default="160x120")
    p.add_argument("--rollout", type=int, default=256, help="steps per env of the timed iteration (the paper's is 2048)")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    w, h = (int(v) for v in args.size.split("x"))
    cfg = resolve(RunRequest(suite="cw10", method="sphere", tasks=1, device="cpu", vec_env="dummy", overrides=(f"ppo.n_steps={args.rollout}",)))
    suite = suite_of(cfg)
    env = make_vec_env(task_factories(suite, suite.tasks[0], cfg.ppo.n_envs, 0), "dummy")
    model = build_model(cfg, env, "cpu")
    factory = RunView(cfg, "/nonexistent").eval_factories(0)[0]
    settings = VideoSettings(width=w, height=h, stride=args.stride, steps=args.steps)
    clips, iters = [], []
    model.learn(cfg.ppo.n_envs * args.rollout)  # warm-up: one iteration
    for _ in range(args.rounds):
        t = time.thread_time()
        episode = clip(model, factory, settings, 500)
        encode_gif(episode.frames, settings.fps)
        clips.append(time.thread_time() - t)
        t = time.thread_time()
        model.learn(cfg.ppo.n_envs * args.rollout, reset_num_timesteps=False)
        iters.append(time.thread_time() - t)
    c, it = statistics.median(clips), statistics.median(iters)
    per_task = 62 * it * 2048 / args.rollout
    print(f"clip ({args.steps} steps, every {args.stride}th frame, {w}x{h}): {c:.2f} s CPU; PPO iteration ({cfg.ppo.n_envs}x{args.rollout} steps): {it:.2f} s CPU")
    print(f"clip / iteration = {c / it:.3f}; clip / 1M-step task (62 iterations of 2,048) = {c / per_task:.5f} ({100 * c / per_task:.3f}%)")


if __name__ == "__main__":
    main()
