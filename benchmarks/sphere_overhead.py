"""SPHERE's cost per PPO update, as ratios against the same update without it, in one run.

Two measurements, each interleaving the variants in a shuffled order every round and reporting
the median over rounds of the per-round ratio. With one torch thread all work runs on the calling
thread, so its CPU time (``time.thread_time``) is measured: unlike wall time it does not count
waiting for cores that other processes hold.

1. **Learner update** (the figure the target refers to): ``MoEPPO.train()`` exactly as
   ``python -m rl_moe.crl --suite cw10-cw`` builds it (Top-K MoE actor, E experts of 3x256, K=2,
   dense critic, batch 256), one epoch over a real CW10 rollout (hammer-v3, 8 envs x 256 steps =
   8 minibatches); SB3's minibatch sampling, logging and clipping included.
2. **Bare minibatch**: one forward, backward and optimizer step of the PPO loss on fixed data,
   with two naive penalties for reference.

Variants:

- ``sphere (fixed lambda)``: the penalty alone (sample-space Gram, routed rows only);
- ``sphere (adaptive lambda)``: the paper default (App. A.3): also the gradient norm of the
  penalty over the actor, i.e. one more backward through the actor per minibatch;
- ``sphere (adaptive, ratio_every=8)``: the gradient-norm ratio refreshed every 8 minibatches;
- ``sphere (loss_ratio, rho=0.05)``: the SPHERE authors' default rule, lambda = rho*|L_actor|/L_SPHERE
  (no gradient norms, so no extra backward);
- ``naive feature Gram``: A = Phi^T Phi / N on the dense Phi (m = E*256 >> N), for reference;
- ``naive per-expert loop``: sample Gram with one autograd product per expert, for reference.

- ``sphere (adaptive, authors' arithmetic)``: the adaptive rule with the SPHERE authors' norms
  (``--preset authors``'s ``norm_eps`` and log-std in theta; learner update only);
- ``no sphere, KL-adaptive rate``: Top-K with ``ppo.target_kl=0.03`` (a host read per minibatch).

Run: ``python benchmarks/sphere_overhead.py [--experts 10 160] [--rounds 15] [--threads 1] [--learner-only]``.
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.logger import configure

from rl_moe.algos.backward import regularized_backward
from rl_moe.algos.common import DeviceTermLog, RegularizedMixin
from rl_moe.continual.agents import begin_task, build_model
from rl_moe.envs.factories import make_vec_env, task_factories
from rl_moe.continual.resolve import RunRequest, resolve, suite_of
from rl_moe.policies import MoEActorCriticPolicy
from rl_moe.regularizers import Sphere, loss_context
from rl_moe.regularizers.gram import GramStats
from rl_moe.regularizers.sphere import sphere_value

N, OBS, ACT = 256, 39, 4


def _naive_feature(out) -> torch.Tensor:
    phi = out.phi()  # (N, m)
    a = phi.t() @ phi / phi.shape[0]  # (m, m)
    return a.pow(2).sum() - a.trace() ** 2 / a.shape[0]


def _naive_loop(out) -> torch.Tensor:
    g = out.groups[0]
    d, f = g.dispatch, g.expert.hidden[-1] * g.dispatch.weight[:, None]  # (R, H)
    gram = f.new_zeros(N, N)
    for rows, idx in zip(torch.split(f, list(d.counts)), torch.split(d.sample_idx, list(d.counts))):
        if rows.shape[0]:
            gram = gram.index_put((idx[:, None], idx[None, :]), rows @ rows.t(), accumulate=True)
    gram = gram / N
    m = d.n_experts * f.shape[1]
    return sphere_value(GramStats(gram.pow(2).sum(), gram.trace(), m, N, gram))


class _Learner(RegularizedMixin):
    """Just the learner's loss machinery, so the benchmark times the same backward as training."""

    def __init__(self, policy: MoEActorCriticPolicy, regularizers: list) -> None:
        self.policy = policy
        self._init_regularizers(regularizers)


def make_update(policy: MoEActorCriticPolicy, data: dict[str, torch.Tensor]) -> Callable[[str], None]:
    regs = {
        "fixed": Sphere(rho=1e-3, coef_mode="fixed"),
        "adaptive": Sphere(rho=0.1),
        "adaptive8": Sphere(rho=0.1, ratio_every=8),
        "loss_ratio": Sphere(rho=0.05, coef_mode="loss_ratio"),
    }
    learners = {name: _Learner(policy, [reg]) for name, reg in regs.items()}
    learners["none"] = _Learner(policy, [])
    naive = {"feature": _naive_feature, "loop": _naive_loop}

    def update(variant: str) -> None:
        values, log_prob, _, out, _ = policy.evaluate_actions_with_outputs(data["obs"], data["act"])
        ratio = torch.exp(log_prob - data["old_log_prob"])
        adv = data["adv"]
        policy_loss = -torch.min(adv * ratio, adv * ratio.clamp(0.8, 1.2)).mean()
        value_loss = torch.nn.functional.mse_loss(data["ret"], values.flatten())
        policy.optimizer.zero_grad()
        if variant in naive:
            (policy_loss + 0.5 * value_loss + 1e-3 * naive[variant](out)).backward()
        else:
            learner = learners[variant]
            losses = {"actor": policy_loss, "value": value_loss}
            ctx = loss_context(learner, "ppo", None, {"actor": (out,)}, {"actor": policy_loss, "critic": value_loss}, losses)
            regularized_backward(learner.regularizers, ctx, policy_loss, 0.5 * value_loss, policy.parameters(), DeviceTermLog())
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 0.5)
        policy.optimizer.step()

    return update


def bench(n_experts: int, rounds: int, variants: list[str]) -> dict[str, float]:
    """Median over rounds of (variant time / no-SPHERE time), the order shuffled in every round."""
    torch.manual_seed(0)
    obs_space = spaces.Box(-1, 1, (OBS,), np.float32)
    act_space = spaces.Box(-1, 1, (ACT,), np.float32)
    policy = MoEActorCriticPolicy(obs_space, act_space, lambda _: 3e-4, n_experts=n_experts, top_k=2)
    data = dict(
        obs=torch.randn(N, OBS), act=torch.rand(N, ACT) * 2 - 1, adv=torch.randn(N), ret=torch.randn(N), old_log_prob=torch.randn(N) - 4
    )
    update = make_update(policy, data)
    for v in variants:  # warm-up
        update(v)
    rng = random.Random(0)
    ratios: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(rounds):
        order = ["none", *variants]
        rng.shuffle(order)
        took = {}
        for v in order:
            t0 = time.thread_time()
            update(v)
            took[v] = time.thread_time() - t0
        for v in variants:
            ratios[v].append(took[v] / took["none"])
    return {v: statistics.median(r) for v, r in ratios.items()}


#: Learner variants: ``--set`` overrides of a CW10 run (``none`` is the Top-K method without SPHERE).
LEARNER_VARIANTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "none": ("topk", ()),
    "fixed": ("sphere", ("reg.sphere.coef_mode=fixed",)),
    "adaptive": ("sphere", ()),
    "adaptive8": ("sphere", ("reg.sphere.ratio_every=8",)),
    "loss_ratio": ("sphere", ("reg.sphere.coef_mode=loss_ratio", "reg.sphere.rho=0.05")),
    # The authors' lambda arithmetic (--preset authors, on our network so that only it differs).
    "authors_lambda": ("sphere", ("reg.sphere.norm_eps=1e-8", "reg.sphere.log_std_in_theta=true")),
    # SBX's KL-adaptive rate: one host read of the KL per minibatch, no SPHERE.
    "kl_lr": ("topk", ("ppo.target_kl=0.03",)),
}


def bench_learner(n_experts: int, rounds: int, n_envs: int = 8, n_steps: int = 256) -> dict[str, float]:
    """Median over rounds of (``train()`` time with the variant / without SPHERE), one shared rollout."""
    common = (f"net.n_experts={n_experts}", f"ppo.n_envs={n_envs}", f"ppo.n_steps={n_steps}", "ppo.n_epochs=1")
    models = {}
    for name, (method, extra) in LEARNER_VARIANTS.items():
        cfg = resolve(RunRequest(suite="cw10-cw", method=method, tasks=1, device="cpu", vec_env="dummy", overrides=(*common, *extra)))
        suite = suite_of(cfg)
        env = make_vec_env(task_factories(suite, suite.tasks[0], n_envs, 0), "dummy")
        model = build_model(cfg, env, "cpu")
        begin_task(model, cfg, 0, 0)
        model.set_logger(configure(None, []))
        models[name] = model
    base = models["none"]
    base.learn(n_envs * n_steps)  # one real rollout; every variant then trains on it
    # Every timed call starts from the same weights and Adam state: left to train on, the
    # variants would drift apart, and with them their routing and so the Gram's cost.
    start = copy.deepcopy(base.policy.state_dict()), copy.deepcopy(base.policy.optimizer.state_dict())

    def timed(model: BaseAlgorithm) -> float:
        model.policy.load_state_dict(start[0])
        model.policy.optimizer.load_state_dict(start[1])
        t0 = time.thread_time()
        model.train()
        return time.thread_time() - t0

    for model in models.values():
        model.rollout_buffer = base.rollout_buffer
        timed(model)  # warm-up
    rng = random.Random(0)
    ratios: dict[str, list[float]] = {v: [] for v in models if v != "none"}
    for _ in range(rounds):
        order = list(models)
        rng.shuffle(order)
        took = {v: timed(models[v]) for v in order}
        for v in ratios:
            ratios[v].append(took[v] / took["none"])
    for model in models.values():
        model.get_env().close()
    return {v: statistics.median(r) for v, r in ratios.items()}


LABELS = {
    "fixed": "sphere (fixed lambda)",
    "adaptive": "sphere (adaptive lambda, default)",
    "adaptive8": "sphere (adaptive, ratio_every=8)",
    "loss_ratio": "sphere (loss_ratio, rho=0.05)",
    "authors_lambda": "sphere (adaptive, authors' arithmetic)",
    "kl_lr": "no sphere, KL-adaptive rate (target 0.03)",
    "feature": "naive feature-space Gram (m x m)",
    "loop": "naive per-expert loop, sample space",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experts", type=int, nargs="+", default=[10, 160])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (CPU time is exact for 1)")
    parser.add_argument("--learner-only", action="store_true", help="measure 1 only (the learner update)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"CPU, {args.threads} thread(s); ratio = thread CPU time with the variant / that of the same update")
    print("without SPHERE (median over rounds)")
    print("1. learner update: MoEPPO.train(), CW10 hammer-v3 rollout, 8 minibatches of 256, MoE actor 3x256 K=2")
    for e in args.experts:
        med = bench_learner(e, args.rounds if e <= 40 else max(10, args.rounds // 2))
        print(f"E={e}:")
        for v, ratio in med.items():
            print(f"  {LABELS[v]:<40s} {ratio:.3f}x")
    if args.learner_only:
        return
    print(f"2. bare minibatch: forward, backward, optimizer step, batch {N}, MoE actor 3x256 K=2, dense critic")
    for e in args.experts:
        variants = ["fixed", "adaptive", "adaptive8", "loss_ratio", "loop"]
        med = bench(e, args.rounds if e <= 40 else max(10, args.rounds // 2), variants)
        if e <= 40:  # the m x m Gram is too slow for large E; timed apart so its memory churn stays out
            med.update(bench(e, 5, ["feature"]))
        print(f"E={e}:")
        for v, ratio in med.items():
            print(f"  {LABELS[v]:<40s} {ratio:.3f}x")


if __name__ == "__main__":
    main()
