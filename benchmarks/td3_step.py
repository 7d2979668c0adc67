"""Cost of one TD3 gradient step with MoE networks, as ratios measured in one run.

TD3 takes a gradient step per env step (per 4 on the smoke suite), so anything per step counts:
the learner's finiteness check over every weight and gradient (:mod:`rl_moe.algos.guard`) and
the per-expert dispatch of the routed rows. Printed per network size (the paper's 3x256 and the
smoke suite's 2x64 with its 32-wide gate):

- MoE TD3 (Top-K E=10, K=2 actor and critics) against SB3 TD3 ``MlpPolicy`` of the expert's size;
- the guard's share of a MoE step, with the min/max check the learner uses and with the
  ``isfinite`` mask it replaced, and what the step would cost with the latter (x today's step).

    OMP_NUM_THREADS=1 python benchmarks/td3_step.py [--batch 128] [--rounds 9]
"""

from __future__ import annotations

import argparse
import os
import sys

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import TD3

sys.path.insert(0, os.path.dirname(__file__))
from _timing import interleaved_medians  # noqa: E402

from rl_moe.algos import MoETD3  # noqa: E402
from rl_moe.algos.guard import parameters_finite  # noqa: E402
from rl_moe.policies import MoETD3Policy  # noqa: E402


def isfinite_mask_check(params: list[torch.nn.Parameter]) -> bool:
    """The check before: an ``isfinite`` mask per weight and gradient."""
    flags = [torch.isfinite(t).all() for p in params for t in (p.detach(), p.grad) if t is not None]
    return bool(torch.stack(flags).all())


def filled(model: TD3, env: gym.Env, n: int) -> TD3:
    """``model`` with ``n`` random transitions in its replay buffer."""
    obs, _ = env.reset(seed=0)
    for _ in range(n):
        act = env.action_space.sample()
        nxt, rew, term, trunc, _ = env.step(act)
        model.replay_buffer.add(obs[None], nxt[None], act[None], np.array([rew]), np.array([term]), [{}])
        obs = env.reset()[0] if term or trunc else nxt
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    env = gym.make("Pendulum-v1")
    env.action_space.seed(0)
    print(f"threads=1 batch={args.batch} E=10 K=2, Pendulum spaces; one gradient step each")
    print(f"{'experts':<10} {'MoE / SB3 MLP':>14} {'guard share':>12} {'isfinite share':>15} {'step with isfinite':>19}")
    # (expert widths, gate widths): the paper's networks and the smoke suite's "net" section.
    for hidden, gate in (((256, 256, 256), (256,)), ((64, 64), (32,))):
        kw = dict(learning_starts=0, batch_size=args.batch, seed=0)
        net = dict(moe="topk", critic_moe=True, hidden=hidden, gate_hidden=gate)
        moe = filled(MoETD3(MoETD3Policy, env, policy_kwargs=net, **kw), env, 1000)
        mlp = filled(TD3("MlpPolicy", env, policy_kwargs=dict(net_arch=list(hidden)), **kw), env, 1000)
        moe._setup_learn(1, None)  # type: ignore[attr-defined]  # SB3 sets the logger here
        mlp._setup_learn(1, None)  # type: ignore[attr-defined]
        params = list(moe.policy.parameters())
        moe.train(gradient_steps=1, batch_size=args.batch)  # gradients exist from here on
        times = interleaved_medians(
            {
                "moe": lambda: moe.train(gradient_steps=1, batch_size=args.batch),
                "mlp": lambda: mlp.train(gradient_steps=1, batch_size=args.batch),
                "guard": lambda: parameters_finite(params),
                "isfinite": lambda: isfinite_mask_check(params),
            },
            rounds=args.rounds,
        )
        name = "x".join(str(h) for h in hidden)
        before = (times["moe"] - times["guard"] + times["isfinite"]) / times["moe"]
        print(f"{name:<10} {times['moe'] / times['mlp']:>13.2f}x {times['guard'] / times['moe']:>11.1%} {times['isfinite'] / times['moe']:>14.1%} {before:>18.2f}x")


if __name__ == "__main__":
    main()
