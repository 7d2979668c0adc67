"""Each plasticity method's cost per PPO update, as a ratio to Top-K's update, in one run.

``MoEPPO.train()`` exactly as ``python -m rl_moe.crl --suite cw10`` builds it for each ``--method``
(Top-K MoE actor, E=10 experts of 3x256, K=2, dense critic, batch 256), one epoch of 8 minibatches
over one real hammer-v3 rollout that every method trains on. Each timed call starts from the
method's own weights and optimizer state as they stood before the first call, so no method drifts
over the rounds. Methods are timed in a shuffled order every round; the figure is the median over
rounds of (the method's thread CPU time / Top-K's in the same round). With one torch thread all
work runs on the calling thread, so CPU time does not count waiting for cores other processes hold.

A method that acts at task boundaries only (``injection``, ``reset``, ``snp``) costs its update's
share here: ``injection`` is timed after one injection (its grown heads), the others at their
boundaries' steady state. What a boundary itself costs is not an update's cost and is not timed.

Run: ``python benchmarks/method_overhead.py [--rounds 7] [--methods ln trac ...]``.
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import time

import torch
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.logger import configure

from rl_moe.continual.agents import begin_task, build_model
from rl_moe.continual.resolve import RunRequest, resolve, suite_of
from rl_moe.envs.factories import make_vec_env, task_factories

#: The plasticity methods compared against SPHERE (docs/regularizers.md's table), and SPHERE.
METHODS: tuple[str, ...] = (
    "sphere", "ln", "parseval", "cbp", "redo", "cchain", "specnorm", "specreg", "load_balance", "ortho", "snp",
    "l2init", "injection", "reset", "crelu", "nap", "trac", "fourier",
)  # fmt: skip
#: Methods timed after their first task boundary (their update differs from then on).
AFTER_BOUNDARY: tuple[str, ...] = ("injection",)


def _model(method: str, n_envs: int, n_steps: int) -> BaseAlgorithm:
    overrides = (f"ppo.n_envs={n_envs}", f"ppo.n_steps={n_steps}", "ppo.n_epochs=1")
    cfg = resolve(RunRequest(suite="cw10", method=method, tasks=2, device="cpu", vec_env="dummy", overrides=overrides))
    suite = suite_of(cfg)
    env = make_vec_env(task_factories(suite, suite.tasks[0], n_envs, 0), "dummy")
    model = build_model(cfg, env, "cpu")
    begin_task(model, cfg, 0, 0)
    if method in AFTER_BOUNDARY:
        begin_task(model, cfg, 1, 0)
    model.set_logger(configure(None, []))
    return model


def bench(methods: tuple[str, ...], rounds: int, n_envs: int = 8, n_steps: int = 256) -> dict[str, float]:
    """Median over rounds of (``train()`` time of each method / Top-K's), one shared rollout."""
    models = {"topk": _model("topk", n_envs, n_steps), **{m: _model(m, n_envs, n_steps) for m in methods}}
    base = models["topk"]
    base.learn(n_envs * n_steps)  # one real rollout; every method then trains on it
    starts = {}
    for name, model in models.items():
        model.rollout_buffer = base.rollout_buffer
        starts[name] = copy.deepcopy(model.policy.state_dict()), copy.deepcopy(model.policy.optimizer.state_dict())

    def timed(name: str) -> float:
        model = models[name]
        model.policy.load_state_dict(starts[name][0])
        model.policy.optimizer.load_state_dict(starts[name][1])
        t0 = time.thread_time()
        model.train()
        return time.thread_time() - t0

    for name in models:
        timed(name)  # warm-up
    rng = random.Random(0)
    ratios: dict[str, list[float]] = {m: [] for m in methods}
    for _ in range(rounds):
        order = list(models)
        rng.shuffle(order)
        took = {name: timed(name) for name in order}
        for m in methods:
            ratios[m].append(took[m] / took["topk"])
    for model in models.values():
        model.get_env().close()
    return {m: statistics.median(r) for m, r in ratios.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("CPU, 1 thread; ratio = thread CPU time of the method's PPO update / Top-K's (median over rounds)")
    print("MoEPPO.train() as --suite cw10 builds it, one epoch of 8 minibatches of 256 over one hammer-v3 rollout")
    for method, ratio in bench(tuple(args.methods), args.rounds).items():
        print(f"  {method:<14s} {ratio:.3f}x")


if __name__ == "__main__":
    main()
