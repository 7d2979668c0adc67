"""Where the exact adaptive lambda's cost goes: the penalty's backward against the actor loss's.

SPHERE's exact rule (App. A.3) needs ||grad L_actor|| and ||grad L_SPHERE|| over the actor's
parameters on every minibatch, so the penalty's gradient is a second backward through the expert
stack. This script takes one PPO minibatch of the CW10 actor (Top-K, E experts of 3x256, K=2,
batch 256, 1 thread) and, with the torch profiler, splits each backward into matrix products
(``mm``/``addmm``/``bmm``, whose multiply-adds any exact method must also do) and everything else
(the share a fused backward carrying both cotangents at once could at most remove). It also
prints the analytic multiply-add count of the two passes, from the routed rows per expert.

    OMP_NUM_THREADS=1 python benchmarks/sphere_backward.py [--experts 10] [--rounds 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from gymnasium import spaces
from torch.autograd.profiler import profile

from rl_moe.policies import MoEActorCriticPolicy
from rl_moe.regularizers import Sphere, loss_context

N, OBS, ACT = 256, 39, 4
GEMMS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


class _Learner:
    """What :func:`loss_context` reads from a learner."""

    def __init__(self, policy: MoEActorCriticPolicy, regularizers: list) -> None:
        self.policy, self.regularizers = policy, regularizers


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--experts", type=int, default=10)
    p.add_argument("--rounds", type=int, default=20)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    box = lambda d: spaces.Box(-1, 1, (d,), np.float32)  # noqa: E731
    policy = MoEActorCriticPolicy(box(OBS), box(ACT), lambda _: 3e-4, n_experts=args.experts, top_k=2)
    obs, act = torch.randn(N, OBS), torch.rand(N, ACT) * 2 - 1
    adv, old = torch.randn(N), torch.randn(N) - 4
    reg = Sphere(rho=0.1)
    learner = _Learner(policy, [reg])
    params: list[torch.nn.Parameter] = []  # the parameters lambda's norms are taken over

    def graph() -> tuple[torch.Tensor, torch.Tensor]:
        values, log_prob, _, out, _ = policy.evaluate_actions_with_outputs(obs, act)
        ratio = torch.exp(log_prob - old)
        loss = -torch.min(adv * ratio, adv * ratio.clamp(0.8, 1.2)).mean()
        ctx = loss_context(learner, "ppo", None, {"actor": (out,)}, {"actor": loss, "critic": values.mean()}, {"actor": loss})
        reg.observe(ctx)
        (term,) = reg.penalty(ctx)
        assert term.scale is not None
        params[:] = [q for q in term.scale.params if q.requires_grad]
        return loss, term.loss

    def backward_seconds(which: int) -> float:
        losses = graph()
        t0 = time.thread_time()
        torch.autograd.grad(losses[which], params, allow_unused=True)
        return time.thread_time() - t0

    def gemm_share(which: int) -> tuple[float, float]:
        losses = graph()
        with profile(use_kineto=False) as prof:
            torch.autograd.grad(losses[which], params, allow_unused=True)
        events = prof.key_averages()
        total = sum(e.self_cpu_time_total for e in events)
        gemm = sum(e.self_cpu_time_total for e in events if e.key in GEMMS)
        return gemm / total, total

    for which in (0, 1, 0, 1):  # warm-up
        backward_seconds(which)
    times: dict[int, list[float]] = {0: [], 1: []}
    for _ in range(args.rounds):
        for which in (0, 1):
            times[which].append(backward_seconds(which))
    actor_ms, pen_ms = (1e3 * statistics.median(times[w]) for w in (0, 1))
    shares = [statistics.median(gemm_share(w)[0] for _ in range(5)) for w in (0, 1)]
    _report(args.experts, args.rounds, actor_ms, pen_ms, shares)


def _report(experts: int, rounds: int, actor_ms: float, pen_ms: float, shares: list[float]) -> None:
    """Print the two backwards' medians, their products' shares and the penalty's multiply-add rate."""
    # Multiply-adds of one backward through the routed experts: per linear layer an input
    # gradient (except the first) and a weight gradient, each rows x in x out.
    dims = (OBS, 256, 256, 256)
    rows = N * 2
    macs = sum(rows * a * b * (1 if i == 0 else 2) for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])))
    print(f"CPU, 1 thread, E={experts}, K=2, 3x256 experts, batch {N}; median of {rounds} rounds")
    print(f"  actor-loss backward   {actor_ms:6.2f} ms, matrix products {100 * shares[0]:4.1f}% of its op time")
    print(f"  penalty backward      {pen_ms:6.2f} ms, matrix products {100 * shares[1]:4.1f}% of its op time")
    print(f"  penalty / actor-loss backward: {pen_ms / actor_ms:.2f}x")
    print(f"  expert-stack multiply-adds per backward: {macs / 1e6:.0f}M ({macs / 1e9 / (pen_ms / 1e3):.1f} GMAC/s in the penalty's)")
    print(f"  at most removable by fusing the two passes: {100 * (1 - shares[1]):.0f}% of the penalty's backward")


if __name__ == "__main__":
    main()
