"""Cost of one PPO minibatch (B=256, forward + backward of the PPO loss) per network kind, as a
ratio against the dense-MLP policy, measured in one run.

Policies follow the paper: MoE actor (E=10, K=2, 3x256 experts) and dense critic; the baseline is
the same policy with a dense actor of the expert's size. The actor-only ratio (network forward +
backward alone) is printed too. Target: Top-K <= 2.5x.

    OMP_NUM_THREADS=1 python benchmarks/moe_throughput.py [--threads 1] [--batch 256]
"""

from __future__ import annotations

import argparse
import os
import sys

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from _timing import interleaved_medians  # noqa: E402

from rl_moe.nn import NETWORK_KINDS, NetConfig, build_network  # noqa: E402
from rl_moe.policies import MoEActorCriticPolicy  # noqa: E402


def ppo_step(policy: MoEActorCriticPolicy, obs: torch.Tensor, act: torch.Tensor, adv: torch.Tensor, old_logp: torch.Tensor, ret: torch.Tensor):
    def run() -> None:
        values, logp, entropy = policy.evaluate_actions(obs, act)
        ratio = torch.exp(logp - old_logp)
        pg = -torch.min(adv * ratio, adv * ratio.clamp(0.8, 1.2)).mean()
        loss = pg + 0.5 * torch.nn.functional.mse_loss(ret, values.flatten())
        policy.optimizer.zero_grad()
        loss.backward()

    return run


def net_step(net: torch.nn.Module, obs: torch.Tensor):
    def run() -> None:
        net.zero_grad()
        net(obs).out.pow(2).mean().backward()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--experts", type=int, default=10)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    obs_space = gym.spaces.Box(-np.inf, np.inf, (39,), np.float32)  # MetaWorld v3 observation
    act_space = gym.spaces.Box(-1, 1, (4,), np.float32)
    n = args.batch
    obs, act = torch.randn(n, 39), torch.rand(n, 4) * 2 - 1
    adv, old_logp, ret = torch.randn(n), torch.randn(n) - 5, torch.randn(n)

    kinds = ["mlp", *[k for k in NETWORK_KINDS if k != "mlp"]]
    policy_fns, net_fns = {}, {}
    for kind in kinds:
        policy = MoEActorCriticPolicy(obs_space, act_space, lambda _: 3e-4, moe=kind, n_experts=args.experts, top_k=args.top_k)
        policy_fns[kind] = ppo_step(policy, obs, act, adv, old_logp, ret)
        net = build_network(39, 4, NetConfig(kind=kind, n_experts=args.experts, top_k=args.top_k))
        net_fns[kind] = net_step(net, obs)
    t_policy = interleaved_medians(policy_fns, rounds=args.rounds)
    t_net = interleaved_medians(net_fns, rounds=args.rounds)

    print(f"threads={args.threads} batch={n} E={args.experts} K={args.top_k}; ratios vs dense MLP (same expert size)")
    print(f"{'kind':<15}{'PPO minibatch':>15}{'actor only':>12}")
    for kind in kinds:
        print(f"{kind:<15}{t_policy[kind] / t_policy['mlp']:>14.2f}x{t_net[kind] / t_net['mlp']:>11.2f}x")
    verdict = "PASS" if t_policy["topk"] / t_policy["mlp"] <= 2.5 else "FAIL"
    print(f"target topk PPO minibatch <= 2.5x: {verdict}")


if __name__ == "__main__":
    main()
