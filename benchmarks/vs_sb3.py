"""A ``cw10`` task's Top-K learner against what a user would run instead: SB3's PPO with
``MlpPolicy`` 3 × 256, on the same envs, side by side in one run.

Ours is Top-K as ``python -m rl_moe.crl --suite cw10 --method topk`` builds it (the authors'
network: E = 10 experts of 3 × 256, K = 2, a 3 × 256 gate, LeCun-normal init, no SPHERE). SB3's is
``PPO("MlpPolicy", net_arch=dict(pi=[256] * 3, vf=[256] * 3))`` with the same PPO settings (8
envs, the rollout length asked, minibatches of 256, 10 epochs, the same γ, λ, clip range, grad-norm
clip and learning rate), on the same fast-path MetaWorld envs. Each learner runs rollout-plus-update
cycles, alternated a b b a, and the medians of its env, acting and update seconds are compared.

The ratio printed is SB3's time over ours (≥ 1.0: ours is at least as fast). Ours computes more:
its actor routes every row to 2 of 10 experts and runs a gate of the experts' size, so the update's
matrix products are counted (torch's profiler) and printed beside the times.

    OMP_NUM_THREADS=1 python benchmarks/vs_sb3.py [--tasks hammer-v3 push-wall-v3] [--rounds 4]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from stable_baselines3 import PPO

from rl_moe.continual.agents import begin_task, build_model
from rl_moe.continual.resolve import RunRequest, resolve, suite_of
from rl_moe.envs.factories import make_vec_env, task_factories

sys.path.insert(0, os.path.dirname(__file__))
from task_time_split import _alternated, _Cycles, _update_flops  # noqa: E402

#: SB3's MlpPolicy at the experts' size: three hidden layers of 256 for the actor and the critic.
SB3_NET = {"net_arch": {"pi": [256] * 3, "vf": [256] * 3}}


def _cfg(n_steps: int):  # type: ignore[no-untyped-def]
    return resolve(RunRequest(suite="cw10", method="topk", tasks=10, vec_env="dummy", device="cpu", overrides=(f"ppo.n_steps={n_steps}",)))


def _envs(task_name: str, n_steps: int):  # type: ignore[no-untyped-def]
    cfg = _cfg(n_steps)
    suite = suite_of(cfg)
    task = next(t for t in suite.tasks if t.name == task_name)
    return cfg, make_vec_env(task_factories(suite, task, cfg.ppo.n_envs, 0), "dummy")


def _ours(task_name: str, n_steps: int):  # type: ignore[no-untyped-def]
    cfg, env = _envs(task_name, n_steps)
    model = build_model(cfg, env, "cpu")
    begin_task(model, cfg, 0, 0)
    return cfg, model, env


def _sb3(task_name: str, n_steps: int):  # type: ignore[no-untyped-def]
    cfg, env = _envs(task_name, n_steps)
    ppo = cfg.ppo
    model = PPO("MlpPolicy", env, learning_rate=ppo.lr_start, n_steps=n_steps, batch_size=ppo.batch_size, n_epochs=ppo.n_epochs, gamma=ppo.gamma,
                gae_lambda=ppo.gae_lambda, clip_range=ppo.clip_range, max_grad_norm=ppo.max_grad_norm, ent_coef=ppo.ent_coef, vf_coef=ppo.vf_coef,
                policy_kwargs=SB3_NET, seed=0, device="cpu")  # fmt: skip
    return model, env


def measure(task_name: str, rounds: int, n_steps: int) -> dict[str, tuple[float, float]]:
    """Median seconds per cycle, (ours, SB3's), of env stepping, acting, the update and the whole
    cycle, alternated; and the update's matrix-product FLOP of each under ``"flop"``."""
    _, ours, ours_env = _ours(task_name, n_steps)
    sb3, sb3_env = _sb3(task_name, n_steps)
    o, s = _alternated(_Cycles(ours, ours_env, n_steps), _Cycles(sb3, sb3_env, n_steps), rounds)
    parts = {name: (o[k], s[k]) for k, name in enumerate(("env", "acting", "update"))}
    return {**parts, "task": (sum(o), sum(s)), "flop": (_update_flops(ours), _update_flops(sb3))}


def _compare(task_name: str, rounds: int, n_steps: int) -> None:
    cfg = _cfg(n_steps)
    m = measure(task_name, rounds, n_steps)
    print(f"cw10 {task_name}: Top-K as the CLI builds it ({', '.join(f'{k} {v}' for k, v in cfg.labels().items())}) against SB3 PPO MlpPolicy 3 × 256, "
          f"1 thread, median of {rounds} alternated cycles of {cfg.ppo.n_envs * n_steps:,} env steps and one update")  # fmt: skip
    print(f"  {'part':<10} {'ours s':>8} {'SB3 s':>8} {'SB3 / ours':>11}")
    for name in ("env", "acting", "update", "task"):
        o, s = m[name]
        print(f"  {name:<10} {o:8.2f} {s:8.2f} {s / o:11.2f}")
    (o_flops, s_flops), o_upd, s_upd = m["flop"], m["update"][0], m["update"][1]
    print(f"  update matmuls: ours {o_flops / 1e9:.1f} GFLOP, SB3 {s_flops / 1e9:.1f} GFLOP ({o_flops / s_flops:.1f}× SB3's); "
          f"per GFLOP ours {o_upd / (o_flops / 1e9):.3f} s, SB3 {s_upd / (s_flops / 1e9):.3f} s")  # fmt: skip
    print(f"  ratio SB3 / ours for the task: {m['task'][1] / m['task'][0]:.2f} (goal >= 1.0)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", nargs="+", default=["hammer-v3", "push-wall-v3"], help="two of the slice's tasks by default")
    p.add_argument("--rounds", type=int, default=4, help="cycles of each learner, alternated")
    p.add_argument("--n-steps", type=int, default=256, help="rollout length per env (8 envs; 256 keeps the paper's minibatch per 25.6 env steps)")
    args = p.parse_args()
    torch.set_num_threads(1)
    for task in args.tasks:
        _compare(task, args.rounds, args.n_steps)


if __name__ == "__main__":
    main()
