"""Exact eNTK effective rank (layerwise Gram identity) vs SLQ, and the probe's share of training time.

Prints ratios measured in one run (absolute times are noise on shared machines):
1. r_e(K) of the E=10, K=2, 3x256 Top-K actor on 39-dim inputs at N = 256/512/1024: exact time,
   SLQ (10 probes, M=30) time, SLQ/exact time ratio, SLQ relative error against exact; then the
   exact method's cost per network kind in units of one forward+backward.
2. Probe cost: MoE PPO on MetaWorld (push-v3) trained with and without PlasticityProbe from the
   same seed; the per-probe cost is also expressed as a share of training time at the default
   interval (ProbeConfig.every, spectral metrics at ProbeConfig.spectral_every).

Usage: OMP_NUM_THREADS=1 python benchmarks/entk_speed.py [--threads 1] [--steps 4096] [--repeats 2] [--device cpu]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

from rl_moe.diagnostics import (
    PlasticityProbe,
    ProbeConfig,
    SlqConfig,
    effective_rank,
    entk_gram,
    slq_entk_rank,
)
from rl_moe.nn import build_network


def timed(fn, repeat: int = 1):
    """(result, best seconds of ``repeat`` calls)"""
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return result, best


def entk_table(sizes: list[int], device: str) -> None:
    torch.manual_seed(0)
    net = build_network(39, 4, kind="topk", n_experts=10, top_k=2, hidden=(256, 256, 256)).to(device)
    print(f"eNTK r_e(K): E=10 K=2 3x256 Top-K actor, in=39, device={device}, threads={torch.get_num_threads()}")
    print(f"{'N':>6} {'exact s':>9} {'SLQ s':>9} {'SLQ/exact':>10} {'r_e exact':>10} {'r_e SLQ':>9} {'SLQ rel err':>12}")
    for n in sizes:
        x = torch.randn(n, 39, device=device)
        entk_gram(net, x)  # warm-up
        exact, t_exact = timed(lambda x=x: effective_rank(entk_gram(net, x).gram), repeat=3)
        est, t_slq = timed(lambda x=x: slq_entk_rank(net, x, cfg=SlqConfig(n_probes=10, n_steps=30)).effective_rank)
        err = abs(est - exact) / exact
        print(f"{n:>6} {t_exact:>9.4f} {t_slq:>9.3f} {t_slq / t_exact:>9.0f}x {exact:>10.2f} {est:>9.2f} {err:>11.1%}")


def kinds_table(n: int, device: str) -> None:
    """Exact r_e(K) per network kind, relative to one forward+backward of the same network."""
    from rl_moe.nn import NETWORK_KINDS

    print(f"\nexact r_e(K) at N={n} per kind (E=10, K=2, 3x256), in units of one forward+backward:")
    x = torch.randn(n, 39, device=device)
    for kind in NETWORK_KINDS:
        torch.manual_seed(0)
        net = build_network(39, 4, kind=kind, n_experts=10, top_k=2, hidden=(256, 256, 256)).to(device)
        _, t_fb = timed(lambda net=net: net(x).out.sum().backward(), repeat=3)
        _, t_exact = timed(lambda net=net: effective_rank(entk_gram(net, x).gram), repeat=3)
        print(f"  {kind:>14}: {t_exact / t_fb:5.1f}x")


def train_seconds(steps: int, probe: PlasticityProbe | None, seed: int) -> float:
    import gymnasium as gym
    import metaworld  # noqa: F401
    from stable_baselines3 import PPO
    from stable_baselines3.common.logger import configure

    from rl_moe.policies import MoEActorCriticPolicy

    env = gym.make("Meta-World/MT1", env_name="push-v3", seed=seed)
    model = PPO(MoEActorCriticPolicy, env, n_steps=1024, batch_size=64, n_epochs=10, seed=seed, policy_kwargs={"moe": "topk"})
    model.set_logger(configure(tempfile.mkdtemp(), ["tensorboard"]))
    start = time.perf_counter()
    model.learn(steps, callback=probe)
    return time.perf_counter() - start


def probe_cost(steps: int, seed: int, repeats: int) -> None:
    import gymnasium as gym
    import metaworld  # noqa: F401  registers the Meta-World/ environments

    from rl_moe.diagnostics import collect_states

    held_out = collect_states(gym.make("Meta-World/MT1", env_name="reach-v3", seed=seed), 256, seed)
    default = ProbeConfig(every=10_000)  # every=0 (at each periodic evaluation) needs a run
    # Probe at every rollout (1024 steps) with the spectral family each time, to time both.
    cfg = ProbeConfig(every=1024, n_states=default.n_states, spectral_every=1024)
    # Interleaved repeats, best of each: the machine's load drifts between runs.
    off, on, on_core = float("inf"), float("inf"), float("inf")
    for _ in range(repeats):
        off = min(off, train_seconds(steps, None, seed))
        run = PlasticityProbe(tempfile.mkdtemp(), states=held_out, config=cfg)
        wall = train_seconds(steps, run, seed)
        if wall < on:
            on, probe = wall, run
        run = PlasticityProbe(tempfile.mkdtemp(), states=held_out, config=ProbeConfig(every=1024, spectral_every=0))
        wall = train_seconds(steps, run, seed)
        if wall < on_core:
            on_core, core_only = wall, run
    n_probes = steps // 1024
    per_probe, per_core = probe.seconds / n_probes, core_only.seconds / n_probes
    per_step = (on_core - core_only.seconds) / steps  # training time per env step, probe excluded
    # At the defaults: core metrics every `every` steps, the spectral family every spectral_every.
    share_default = (per_core / default.every + (per_probe - per_core) / default.spectral_every) / per_step
    print(f"\nProbe cost: MoE PPO (E=10 K=2 3x256, n_steps=1024, 10 epochs) on MetaWorld push-v3, {steps} steps, N={cfg.n_states}")
    print(f"  per probe: all families {per_probe:.3f} s, core only {per_core:.3f} s; training {per_step * 1e3:.2f} ms/env step")
    print(f"  probe share of its own run, probing every 1024 steps: all families {probe.seconds / on:.2%}, core only {core_only.seconds / on_core:.2%}")
    print(f"  wall-time ratio, probe every 1024 steps / no probe (same seed, noisy): {on / off:.3f} (core only {on_core / off:.3f})")
    print(f"  share at the defaults (core every {default.every}, spectral every {default.spectral_every} steps): {share_default:.2%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--steps", type=int, default=4096, help="env steps of each probe-cost training run (0 skips)")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved repeats of the training runs (best kept)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault("MUJOCO_GL", "egl")
    torch.set_num_threads(args.threads)
    entk_table(args.sizes, args.device)
    kinds_table(512, args.device)
    if args.steps > 0:
        probe_cost(args.steps, args.seed, args.repeats)


if __name__ == "__main__":
    main()
