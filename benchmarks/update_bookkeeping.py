"""What the PPO update's logging adds to it, as shares of one update, measured in one run.

Two things were added to the hot path for the logs: the actor's and the critic's gradient norms
before clipping (``train/grad_norm_actor``, ``train/grad_norm_critic``, every minibatch, both clipping
rules), and a copy of the weights at the start of each update for ``train/weight_change``. Each is
timed against the update it belongs to, on the update the CW10 CLI builds (Top-K actor, E=10, 3x256,
K=2, dense critic, one epoch of 8 minibatches over a real hammer-v3 rollout), with thread CPU time:

- ``clipping``: ``clip_gradients`` per minibatch (norms + clipping) minus SB3's bare
  ``clip_grad_norm_`` on the same gradients, times the minibatches, over ``train()``;
- ``weight_change``: the copy and the two norms, over ``train()``; it runs once per update, so
  its share of the CLI's update (10 epochs of 64 minibatches) is also printed;
- ``feature_trace``: ``MoEOutput.feature_trace`` (``train/feature_trace``) on a minibatch's actor
  output and its copy into the update's buffer, per minibatch, over ``train()``.

    OMP_NUM_THREADS=1 python benchmarks/update_bookkeeping.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from stable_baselines3.common.logger import configure
from stable_baselines3.common.vec_env import VecEnv

from rl_moe.algos.clipping import clip_gradients, split_actor_critic
from rl_moe.algos.update import weight_change
from rl_moe.continual.agents import begin_task, build_model
from rl_moe.continual.resolve import RunRequest, resolve, suite_of
from rl_moe.envs.factories import make_vec_env, task_factories


def thread_seconds(fn: Callable[[], object], repeat: int = 1) -> float:
    t0 = time.thread_time()
    for _ in range(repeat):
        fn()
    return (time.thread_time() - t0) / repeat


def _learner(n_envs: int, n_steps: int, grad_clip: str) -> tuple[Any, VecEnv]:
    """A Top-K learner on CW10's first task after one rollout and update, and its envs."""
    overrides = (f"ppo.n_envs={n_envs}", f"ppo.n_steps={n_steps}", "ppo.n_epochs=1", f"ppo.grad_clip={grad_clip}")
    cfg = resolve(RunRequest(suite="cw10-cw", method="topk", tasks=1, device="cpu", vec_env="dummy", overrides=overrides))
    env = make_vec_env(task_factories(suite_of(cfg), suite_of(cfg).tasks[0], n_envs, 0), "dummy")
    model = build_model(cfg, env, "cpu")
    begin_task(model, cfg, 0, 0)
    model.set_logger(configure(None, []))
    model.learn(n_envs * n_steps)
    return model, env


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--grad-clip", default="joint", choices=["joint", "separate"])
    args = p.parse_args()
    torch.set_num_threads(1)
    n_envs, n_steps = 8, 256
    model, env = _learner(n_envs, n_steps, args.grad_clip)
    start = copy.deepcopy(model.policy.state_dict()), copy.deepcopy(model.policy.optimizer.state_dict())
    n_minibatches = n_envs * n_steps // model.batch_size
    params = list(model.policy.parameters())
    split = split_actor_critic(model.policy)

    def train() -> None:
        model.policy.load_state_dict(start[0])
        model.policy.optimizer.load_state_dict(start[1])
        model.train()

    def fill_grads() -> None:
        for q in params:
            q.grad = torch.randn_like(q)

    def ours() -> None:
        clip_gradients(model.policy, model.grad_clip, model.max_grad_norm, split)

    def bare() -> None:
        torch.nn.utils.clip_grad_norm_(params, model.max_grad_norm)

    def weights() -> None:
        before = [q.detach().clone() for q in params]
        weight_change(before, params)

    obs = torch.as_tensor(model.rollout_buffer.observations.reshape(n_envs * n_steps, -1)[: model.batch_size])
    output = model.policy.actor_net(obs)  # a minibatch's actor output, with its graph, as the update holds it
    buffer = torch.zeros(())

    def trace() -> None:
        buffer.copy_(output.feature_trace())

    train()  # warm-up
    fill_grads()
    shares: dict[str, list[float]] = {"clipping": [], "weight_change": [], "feature_trace": []}
    for _ in range(args.rounds):
        total = thread_seconds(train)
        fill_grads()
        extra = thread_seconds(ours, 20) - thread_seconds(bare, 20)
        shares["clipping"].append(extra * n_minibatches / total)
        shares["weight_change"].append(thread_seconds(weights, 5) / total)
        shares["feature_trace"].append(thread_seconds(trace, 50) * n_minibatches / total)
    print(f"CPU, 1 thread, grad_clip={args.grad_clip}, {n_minibatches} minibatches of {model.batch_size} per update, {sum(q.numel() for q in params):,} parameters")
    full = resolve(RunRequest(suite="cw10-cw", method="topk", tasks=1, device="cpu", vec_env="dummy")).ppo
    scale = n_minibatches / (full.n_envs * full.n_steps // full.batch_size * full.n_epochs)
    for name, values in shares.items():
        share = statistics.median(values)
        print(f"  {name:<14s} {100 * share:6.2f}% of this update (median of {args.rounds} rounds)", end="")
        # Clipping and the feature trace run per minibatch, so their shares do not depend on the update's size.
        print(f"; {100 * (share if name != 'weight_change' else share * scale):.3f}% of the CLI's update")
    env.close()


if __name__ == "__main__":
    main()
