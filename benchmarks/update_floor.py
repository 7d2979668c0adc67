"""What a slice task's PPO update cannot go below on this core: its matrix products at the 1024²
matmul rate, and its passes over every parameter (Adam, the gradient clipping, SPHERE's gradient
norms and sums), measured in one run.

``task_time_split.py`` puts the update's floor at its products alone. But a Top-K actor with E = 10
experts holds five times the parameters a state's two experts use, and every minibatch step still
reads and writes all of them: Adam (parameter, gradient and two moments), the clipping (a norm and
a scaling per side) and SPHERE's adaptive λ (the reference and penalty gradients' norms over the
actor, then their weighted sum). These passes do no matrix products; they run at the core's memory
rate. This script times them inside real updates (Top-K + SPHERE as ``--suite cw10`` builds it, one
rollout, thread CPU time), compares each with the rate of a plain copy of the same number of floats,
and prints the share of the 1024² rate the update's products could reach if everything but the
products and these passes cost nothing: the ceiling on ``task_speed.py``'s "share of the peak".

    OMP_NUM_THREADS=1 python benchmarks/update_floor.py [--tasks hammer-v3 push-wall-v3 faucet-close-v3] [--updates 3]
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

import rl_moe.algos.backward as backward_mod
import rl_moe.algos.update as update_mod

sys.path.insert(0, os.path.dirname(__file__))
from _timing import best_seconds  # noqa: E402
from task_time_split import CLOCK, _learner, _matmul_peak, _update_flops

#: Rollout length per env: 8 × 256 = 2,048 steps, eight minibatches of 256 per epoch.
N_STEPS = 256


class _Stages:
    """Thread seconds of the update's parameter passes, each timed where the update calls it."""

    def __init__(self) -> None:
        self.seconds: collections.Counter[str] = collections.Counter()
        self._inner = 0.0  # autograd's share of the SPHERE backward's call, taken out of it

    def timed(self, fn: Callable[..., Any], stage: str, inner: bool = False) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            t0 = CLOCK()
            out = fn(*args, **kwargs)
            dt = CLOCK() - t0
            self.seconds[stage] += dt
            if inner:
                self._inner += dt
            return out

        return call

    @contextmanager
    def installed(self, model: Any) -> Iterator[None]:
        """Wrap Adam's step, the clipping, and the SPHERE backward (minus its autograd calls)."""
        saved = (update_mod.clip_gradients, backward_mod._backward_scaled, torch.autograd.grad, torch.Tensor.backward, model.policy.optimizer.step)
        outer = backward_mod._backward_scaled

        def scaled(*args: Any, **kwargs: Any) -> Any:
            self._inner = 0.0
            t0 = CLOCK()
            out = outer(*args, **kwargs)
            self.seconds["SPHERE's λ: gradient norms and sums"] += CLOCK() - t0 - self._inner
            return out

        update_mod.clip_gradients = self.timed(update_mod.clip_gradients, "clipping (norms, scaling)")
        backward_mod._backward_scaled = scaled
        torch.autograd.grad = self.timed(torch.autograd.grad, "autograd", inner=True)
        torch.Tensor.backward = self.timed(torch.Tensor.backward, "autograd", inner=True)  # type: ignore[method-assign]
        model.policy.optimizer.step = self.timed(model.policy.optimizer.step, "Adam step")
        try:
            yield
        finally:
            update_mod.clip_gradients, backward_mod._backward_scaled, torch.autograd.grad, torch.Tensor.backward, model.policy.optimizer.step = saved


def _copy_rate(n_floats: int, rounds: int = 7) -> float:
    """Bytes per second of ``torch.add(a, b, out=c)`` over ``n_floats``: two reads and one write,
    the pattern of the parameter passes, at the best of a few rounds."""
    a, b, c = torch.randn(n_floats), torch.randn(n_floats), torch.empty(n_floats)
    return 3 * 4 * n_floats / best_seconds(lambda: torch.add(a, b, out=c), 5, rounds, CLOCK)


def _active_experts(model: Any) -> float:
    """Mean number of the actor's experts with routed rows over one rollout's minibatches."""
    obs = torch.as_tensor(model.rollout_buffer.observations.reshape(-1, model.rollout_buffer.observations.shape[-1]), dtype=torch.float32)
    counts = []
    with torch.no_grad():
        for start in range(0, obs.shape[0], model.batch_size):
            out = model.policy.mlp_extractor.actor_net(obs[start : start + model.batch_size])  # type: ignore[attr-defined]
            counts.append(int(torch.unique(out.indices[out.indices >= 0]).numel()))
    return statistics.mean(counts)


def _ops_per_step(model: Any, steps: int) -> tuple[float, list[tuple[str, float]]]:
    """ATen ops dispatched per minibatch step in one more update (autograd's backward included),
    and the most frequent of them with their counts per step."""
    from torch.utils._python_dispatch import TorchDispatchMode

    counts: collections.Counter[str] = collections.Counter()

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            counts[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    with Count():
        model.train()
    return sum(counts.values()) / steps, [(k, v / steps) for k, v in counts.most_common(6)]


def _floor(task: str, updates: int) -> None:
    _, _, _, model, env = _learner(task, None, N_STEPS)
    model.learn(env.num_envs * N_STEPS, reset_num_timesteps=False)  # one rollout and its update: warm
    stages = _Stages()
    totals = []
    with stages.installed(model):
        for _ in range(updates):
            t0 = CLOCK()
            model.train()
            totals.append(CLOCK() - t0)
    update_s = sum(totals)
    n_params = sum(p.numel() for p in model.policy.parameters())
    actor_params = sum(p.numel() for p in model.policy.mlp_extractor.actor_net.parameters()) + model.policy.log_std.numel()  # type: ignore[attr-defined]
    flops = _update_flops(model) * updates
    peak = _matmul_peak()
    rate = _copy_rate(n_params)
    # Floats each minibatch step reads or writes in these passes: Adam 7 per parameter (parameter,
    # gradient, two moments read; parameter, two moments written), the clipping 3 (a norm, a
    # scaling), SPHERE's λ 5 per actor parameter (two norms, then grad += λ · penalty grad).
    steps = updates * model.n_epochs * (env.num_envs * N_STEPS // model.batch_size)
    moved = {"Adam step": 7 * n_params, "clipping (norms, scaling)": 3 * n_params, "SPHERE's λ: gradient norms and sums": 5 * actor_params}
    passes = sum(stages.seconds[k] for k in moved)
    passes_floor = 4 * sum(moved.values()) * steps / rate  # their floats at the copy rate
    products = flops / peak
    print(f"{task}: Top-K + SPHERE (the authors' network), {n_params:,} parameters ({actor_params:,} the actor's), "
          f"{_active_experts(model):.1f} of 10 experts routed to per minibatch; {updates} updates of {steps // updates} minibatch steps")  # fmt: skip
    print("  share of the update's thread time:")
    print(f"    {'matrix products at the 1024² rate':<42} {products / update_s:6.3f}")
    for name, floats in moved.items():
        s = stages.seconds[name]
        print(f"    {name:<42} {s / update_s:6.3f}   its floats at {4 * floats * steps / s / rate:4.2f}× the copy rate")
    print(f"    {'everything else (autograd, forward, loss)':<42} {1 - products / update_s - passes / update_s:6.3f}")
    n_ops, common = _ops_per_step(model, steps // updates)
    print(f"  a minibatch step: {1e3 * update_s / steps:.1f} ms, {n_ops:.0f} ATen ops dispatched (most frequent per step: "
          + ", ".join(f"{k} {v:.0f}" for k, v in common) + ")")  # fmt: skip
    print(f"  the update's floor / the update: {(products + passes_floor) / update_s:.3f} (products at the 1024² rate, the parameter passes' floats at the copy rate)")
    print(f"  the products' share of the 1024² rate: {products / update_s:.3f} now; at most {products / (products + passes_floor):.3f} "
          f"with everything else removed and the parameter passes at the copy rate (goal 0.70)")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", nargs="+", default=["hammer-v3", "push-wall-v3", "faucet-close-v3"], help="the slice's three tasks by default")
    p.add_argument("--updates", type=int, default=3, help="PPO updates timed per task (80 minibatch steps each)")
    args = p.parse_args()
    torch.set_num_threads(1)
    for task in args.tasks:
        _floor(task, args.updates)


if __name__ == "__main__":
    main()
