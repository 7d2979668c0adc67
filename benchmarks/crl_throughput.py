"""Env steps/s of the continual PPO pipeline vs plain SB3 PPO on one CW10 task, in one run.

Compared (same n_envs, n_steps, batch, epochs; CW10 protocol envs):

- ``moe+sphere+probe``: Top-K MoE actor (E=10, K=2, 3x256) + SPHERE + the plasticity probe, built
  exactly as ``python -m rl_moe.crl`` builds it;
- ``moe+sphere`` and ``moe`` (Top-K MoE alone): the same without the probe / without SPHERE;
- ``sb3 mlp``: ``stable_baselines3.PPO("MlpPolicy")`` with its default 64x64 networks;
- ``sb3 mlp 3x256``: the same with the paper's dense width (3 x 256, ReLU).

``moe+sphere+probe`` runs once per ``--vec-env`` backend and ``--threads`` count (torch threads;
an EnvPool pool gets the cores left, at least one); the other variants run on the official
in-process envs with 1 thread, so ``sb3 mlp 3x256`` is the fixed anchor. Rounds alternate between
the variants and the median is reported, so machine load hits all of them alike. Prints steps/s,
the ratios to SB3 PPO, and each backend/thread setting against today's default (official envs,
1 thread).

    python benchmarks/crl_throughput.py [--task faucet-close-v3] [--n-envs 8] [--n-steps 256] [--updates 2]
        [--rounds 3] [--device cuda] [--vec-env dummy envpool] [--threads 1 2] [--all-tasks]
        [--probe-every 100000] [--suite cw10-paper] [--env-path plain fast] [--methods topk sphere]

``--all-tasks`` times only the ``moe+sphere+probe`` variants on every CW10 task (same steps each,
tasks in order, variants alternating within a task) and prints each variant's total time over the
ten tasks against official envs at 1 thread: the speed-up of a whole CW10 run, tasks that a
backend keeps on the official envs included.

``--suite cw10-paper`` times the paper's protocol (fixed positions, 500-step episodes, separate
clipping). ``--env-path plain fast`` times the rl_moe variants on the official envs without and
with the MetaWorld fast path (rl_moe.envs.metaworld_fast); the SB3 anchors always step the plain
official envs, which is what a user would run instead. ``--methods topk sphere`` picks the methods
of the ``--all-tasks`` rows (default: sphere).

``--device`` moves the rl_moe variants (SB3's stay on the CPU, where SB3 runs MLP policies best);
``benchmarks/gpu_throughput.py`` is the fuller GPU benchmark.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
from stable_baselines3 import PPO
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecEnv

from rl_moe.continual.agents import begin_task, build_model
from rl_moe.envs.families import METAWORLD_FAST_VAR
from rl_moe.envs.factories import make_vec_env, task_factories
from rl_moe.continual.probe_states import collect_probe_states, make_probe_callback, probe_factories
from rl_moe.continual.resolve import RunRequest, resolve, suite_of
from rl_moe.envs.threads import split_threads
from rl_moe.envs.suite_spec import TaskSpec as Task


def _measure(make: Callable[[], tuple[BaseAlgorithm, BaseCallback | None]], steps: int) -> float:
    model, callback = make()
    begin = time.perf_counter()
    model.learn(steps, reset_num_timesteps=False, callback=callback)
    rate = steps / (time.perf_counter() - begin)
    model.get_env().close()
    return rate


Maker = Callable[[], tuple[BaseAlgorithm, BaseCallback | None]]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="faucet-close-v3", help="CW10 task (hammer runs on the official envs under envpool)")
    p.add_argument("--n-envs", type=int, default=8)
    p.add_argument("--n-steps", type=int, default=256)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--updates", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="cpu", help="device of the rl_moe variants")
    p.add_argument("--vec-env", nargs="+", default=["dummy"], choices=["dummy", "subproc", "envpool"])
    p.add_argument("--threads", nargs="+", type=int, default=[1], help="torch threads of the moe+sphere+probe variants")
    p.add_argument("--extra", action="store_true", help="also time moe+sphere and moe (official envs, 1 thread)")
    p.add_argument("--all-tasks", action="store_true", help="every CW10 task, moe+sphere+probe variants only")
    p.add_argument("--probe-every", type=int, default=0, help="env steps between probes (0: after every update, the worst case; "
                   "the CLI's CW10 default, 100000, never comes up in the measured steps)")  # fmt: skip
    p.add_argument("--suite", default="cw10-cw", help="cw10-cw (Continual World's rules) or cw10 (the paper's protocol; also cw10-paper)")
    p.add_argument("--env-path", nargs="+", default=["fast"], choices=["plain", "fast"], help="MetaWorld path of the rl_moe variants")
    p.add_argument("--methods", nargs="+", default=["sphere"], choices=["sphere", "topk"], help="methods of the --all-tasks rows")
    return p


class _Variants:
    """Builds each variant's learner on a task: ours as ``python -m rl_moe.crl`` builds them, and
    SB3's ``MlpPolicy`` anchors."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.cores = args, len(os.sched_getaffinity(0))
        overrides = (f"ppo.n_envs={args.n_envs}", f"ppo.n_steps={args.n_steps}", f"ppo.batch_size={args.batch}", f"ppo.n_epochs={args.epochs}")
        self.cfgs = {m: resolve(RunRequest(suite=args.suite, method=m, tasks=1, device=args.device, vec_env="dummy", overrides=overrides)) for m in ("sphere", "topk")}
        self.suite = suite_of(self.cfgs["sphere"])
        pcfg = self.cfgs["sphere"].probe
        self.probe = collect_probe_states(probe_factories(self.suite, 99), pcfg.n_states, stride=pcfg.stride, policy=pcfg.policy, noise=pcfg.noise)

    def env(self, task: Task, vec_env: str = "dummy", path: str = "plain", pool: int = 1) -> VecEnv:
        os.environ[METAWORLD_FAST_VAR] = "1" if path == "fast" else "0"  # read where the envs are built
        return make_vec_env(task_factories(self.suite, task, self.args.n_envs, 0), vec_env, pool)

    def ours(self, task: Task, method: str, with_probe: bool, vec_env: str = "dummy", threads: int = 1, path: str = "fast") -> Maker:
        args = self.args

        def make() -> tuple[BaseAlgorithm, BaseCallback | None]:
            torch_threads, pool = split_threads(threads, vec_env, args.n_envs, self.cores)
            torch.set_num_threads(torch_threads)
            model = build_model(self.cfgs[method], self.env(task, vec_env, path, pool), args.device)
            begin_task(model, self.cfgs[method], 0, 0)
            # Default: the worst case, a probe after every update (the CLI probes every 100k steps
            # on CW10, 0.39% of training by entk_speed.py).
            every = args.probe_every or args.n_envs * args.n_steps
            return model, make_probe_callback(self.probe, every) if with_probe else None

        return make

    def sb3(self, task: Task, net_arch: list[int] | None) -> Maker:
        args = self.args

        def make() -> tuple[BaseAlgorithm, BaseCallback | None]:
            torch.set_num_threads(1)
            kw = {} if net_arch is None else {"policy_kwargs": {"net_arch": net_arch, "activation_fn": torch.nn.ReLU}}
            ppo = PPO("MlpPolicy", self.env(task, "dummy", "plain"), n_steps=args.n_steps, batch_size=args.batch, n_epochs=args.epochs,
                      learning_rate=3e-4, ent_coef=0.0, device="cpu", seed=0, verbose=0, **kw)  # fmt: skip
            return ppo, None

        return make


def _all_tasks(v: _Variants, steps: int) -> None:
    """``--all-tasks``: the moe+sphere+probe variants on every task, and their totals."""
    args = v.args
    ours_only = {
        f"{m}+probe {e} t{t} {p}": (m, e, t, p) for m in args.methods for e in args.vec_env for t in args.threads for p in args.env_path
    }  # fmt: skip
    seconds: dict[str, float] = dict.fromkeys(ours_only, 0.0)
    for task in v.suite.tasks:
        task_rates: dict[str, list[float]] = {k: [] for k in ours_only}
        for _ in range(args.rounds):
            for name, (m, e, t, p) in ours_only.items():
                task_rates[name].append(_measure(v.ours(task, m, True, e, t, p), steps))
        row = []
        for name, samples in task_rates.items():
            rate = statistics.median(samples)
            seconds[name] += steps / rate
            row.append(f"{name.split(' ', 1)[1]} {rate:5.0f}")
        print(f"  {task.name:<22} " + "   ".join(row) + " env steps/s", flush=True)
    for name, total in seconds.items():
        base = seconds.get(name.replace(name.split(" ", 1)[1], "dummy t1 plain"))
        print(f"{name:<34} {v.suite.name} total {total:7.1f} s" + ("" if base is None else f"   time vs official t1 plain = {total / base:.2f}x"))


def _one_task(v: _Variants, steps: int) -> None:
    """Every variant on ``--task``, against SB3's anchors and today's default."""
    args = v.args
    task = next(t for t in v.suite.tasks if t.name == args.task)
    variants: dict[str, Maker] = {}
    for vec_env in args.vec_env:
        for threads in args.threads:
            for path in args.env_path:
                variants[f"moe+sphere+probe {vec_env} t{threads} {path}"] = v.ours(task, "sphere", True, vec_env, threads, path)
    if args.extra:
        variants.update({"moe+sphere": v.ours(task, "sphere", False), "moe": v.ours(task, "topk", False)})
    variants.update({"sb3 mlp": v.sb3(task, None), "sb3 mlp 3x256": v.sb3(task, [256, 256, 256])})
    rates: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.rounds):
        for name, make in variants.items():
            rates[name].append(_measure(make, steps))
    med = {k: statistics.median(r) for k, r in rates.items()}
    print(f"{v.suite.name} {args.task}: {args.n_envs} envs x {args.n_steps} steps, batch {args.batch}, {args.epochs} epochs, "
          f"{args.updates} updates/round, median of {args.rounds} rounds, {v.cores} cores")  # fmt: skip
    for name, rate in med.items():
        print(f"  {name:<30} {rate:8.0f} env steps/s")
    today = med.get("moe+sphere+probe dummy t1 plain")
    for name in (k for k in med if k.startswith("moe+sphere+probe")):
        vs_today = "" if today is None else f"   vs official t1 plain = {med[name] / today:.2f}x"
        print(f"{name:<30} / sb3 mlp 3x256 = {med[name] / med['sb3 mlp 3x256']:.2f}x   / sb3 mlp = {med[name] / med['sb3 mlp']:.2f}x{vs_today}")


def main() -> None:
    args = _parser().parse_args()
    variants = _Variants(args)
    steps = args.n_envs * args.n_steps * args.updates
    (_all_tasks if args.all_tasks else _one_task)(variants, steps)


if __name__ == "__main__":
    main()
