"""Env steps/s of the continual PPO pipeline vs plain SB3 PPO on one CW10 task, in one run.

Compared (same envs, n_envs, n_steps, batch, epochs; CW10 protocol envs; 1 torch thread as the CLI):

- ``moe+sphere+probe``: Top-K MoE actor (E=10, K=2, 3x256) + SPHERE + the plasticity probe, built
  exactly as ``python -m rl_moe.crl`` builds it;
- ``moe+sphere`` and ``moe`` (Top-K MoE alone): the same without the probe / without SPHERE;
- ``sb3 mlp``: ``stable_baselines3.PPO("MlpPolicy")`` with its default 64x64 networks;
- ``sb3 mlp 3x256``: the same with the paper's dense width (3 x 256, ReLU).

Rounds alternate between the variants and the median is reported, so machine load hits all of
them alike. Prints steps/s and the ratios to plain SB3 PPO (target >= 0.8).

    python benchmarks/crl_throughput.py [--task hammer-v3] [--n-envs 8] [--n-steps 256] [--updates 2] [--rounds 3]
        [--device cuda] [--vec-env subproc]

``--device`` moves the rl_moe variants (SB3's stay on the CPU, where SB3 runs MLP policies best);
``benchmarks/gpu_throughput.py`` is the fuller GPU benchmark.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from stable_baselines3 import PPO
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback

from rl_moe.continual.agents import begin_task, build_model
from rl_moe.continual.envs import make_vec_env, task_factories
from rl_moe.continual.probe_states import collect_probe_states, make_probe_callback, probe_factories
from rl_moe.continual.resolve import RunRequest, resolve, suite_of


def _measure(make: Callable[[], tuple[BaseAlgorithm, BaseCallback | None]], steps: int) -> float:
    model, callback = make()
    begin = time.perf_counter()
    model.learn(steps, reset_num_timesteps=False, callback=callback)
    rate = steps / (time.perf_counter() - begin)
    model.get_env().close()
    return rate


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="hammer-v3")
    p.add_argument("--n-envs", type=int, default=8)
    p.add_argument("--n-steps", type=int, default=256)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--updates", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="cpu", help="device of the rl_moe variants")
    p.add_argument("--vec-env", default="dummy", choices=["dummy", "subproc"])
    args = p.parse_args()
    torch.set_num_threads(1)

    overrides = (f"ppo.n_envs={args.n_envs}", f"ppo.n_steps={args.n_steps}", f"ppo.batch_size={args.batch}", f"ppo.n_epochs={args.epochs}")
    cfgs = {m: resolve(RunRequest(suite="cw10", method=m, tasks=1, device=args.device, vec_env=args.vec_env, overrides=overrides)) for m in ("sphere", "topk")}
    suite = suite_of(cfgs["sphere"])
    task = next(t for t in suite.tasks if t.name == args.task)
    steps = args.n_envs * args.n_steps * args.updates
    pcfg = cfgs["sphere"].probe
    probe = collect_probe_states(probe_factories(suite, 99), pcfg.n_states, stride=pcfg.stride, policy=pcfg.policy, noise=pcfg.noise)

    def env():
        return make_vec_env(task_factories(suite, task, args.n_envs, 0), args.vec_env)

    def ours(method: str, with_probe: bool) -> Callable[[], tuple[BaseAlgorithm, BaseCallback | None]]:
        def make() -> tuple[BaseAlgorithm, BaseCallback | None]:
            model = build_model(cfgs[method], env(), args.device)
            begin_task(model, cfgs[method], 0, 0)
            # Worst case: a probe after every update (the CLI probes every steps_per_task/10 steps).
            return model, make_probe_callback(probe, args.n_envs * args.n_steps) if with_probe else None

        return make

    def sb3(net_arch: list[int] | None) -> Callable[[], tuple[BaseAlgorithm, BaseCallback | None]]:
        def make() -> tuple[BaseAlgorithm, BaseCallback | None]:
            kw = {} if net_arch is None else {"policy_kwargs": {"net_arch": net_arch, "activation_fn": torch.nn.ReLU}}
            ppo = PPO("MlpPolicy", env(), n_steps=args.n_steps, batch_size=args.batch, n_epochs=args.epochs,
                      learning_rate=3e-4, ent_coef=0.0, device="cpu", seed=0, verbose=0, **kw)  # fmt: skip
            return ppo, None

        return make

    variants = {"moe+sphere+probe": ours("sphere", True), "moe+sphere": ours("sphere", False), "moe": ours("topk", False), "sb3 mlp": sb3(None), "sb3 mlp 3x256": sb3([256, 256, 256])}
    rates: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.rounds):
        for name, make in variants.items():
            rates[name].append(_measure(make, steps))
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"CW10 {args.task}: {args.n_envs} envs x {args.n_steps} steps, batch {args.batch}, {args.epochs} epochs, "
          f"{args.updates} updates/round, median of {args.rounds} rounds")  # fmt: skip
    for name, rate in med.items():
        print(f"  {name:<18} {rate:8.0f} env steps/s")
    print(f"ratio moe+sphere+probe / sb3 mlp       = {med['moe+sphere+probe'] / med['sb3 mlp']:.2f}x (target >= 0.8)")
    print(f"ratio moe+sphere+probe / sb3 mlp 3x256 = {med['moe+sphere+probe'] / med['sb3 mlp 3x256']:.2f}x")


if __name__ == "__main__":
    main()
