"""PPO update cost, host syncs and end-to-end CW10 throughput on one device, in one run.

Every MoE actor is ``--network``'s (default ``authors``, the network ``cw10`` trains: LeCun init and
a 3 x 256 gate; :data:`rl_moe.continual.networks.NETWORKS`).

Part 1 (update, unless ``--skip-update``): per-minibatch time of one PPO update (batch 256, the
paper's CW10 dims: obs 39, act 4) and, from the torch profiler, aten ops, CUDA launch calls and
host syncs per minibatch, for

- ``sb3 mlp 3x256``: stock ``stable_baselines3.PPO("MlpPolicy")`` with 3 x 256 ReLU layers;
- ``topk``: Top-K MoE actor (E experts, K=2, 3 x 256), dense critic, sync-free update
  (``fast_update="on"``; static-shape layers and CUDA graphs on CUDA, ``--static`` forces the
  static layout on a CPU too, to count its syncs there);
- ``topk+sphere fixed`` / ``topk+sphere``: plus SPHERE with a fixed / the adaptive coefficient;
- ``... (standard)``: the same through the standard update (``fast_update="off"``).

On a CPU the syncs column leaves out the scalar reads inside Adam and ``std`` (see
``rl_moe.algos.profiling.CPU_INTERNAL_SCOPES``), which are not syncs on CUDA.

Ratios are to ``topk`` and to ``sb3 mlp 3x256`` measured in the same run. Part 2 (end to end, unless
``--skip-e2e``): env steps/s of Top-K + SPHERE + probe on ``--device`` (built as ``python -m
rl_moe.crl`` builds it), Top-K alone on ``--device``, and plain SB3 PPO MlpPolicy on the CPU, on one
task of ``--suite`` (default ``cw10``, the slice's) with that suite's PPO settings and network; ratios to the SB3 CPU run, and SPHERE's end-to-end overhead.
Part 3 (rollouts, unless ``--skip-rollout``; run before part 2): per env step of a 256-step rollout
over envs that cost nothing to step, time, aten ops, launches and host syncs of SB3's
``collect_rollouts`` with the device buffer and graphed acting of ``rl_moe/algos/rollout.py``,
against the same loop with SB3's ``RolloutBuffer`` and the same policy.

    python benchmarks/gpu_throughput.py --device cuda --experts 10 160 --vec-env subproc
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.logger import configure
from stable_baselines3.common.vec_env import DummyVecEnv

from rl_moe.algos import MoEPPO
from rl_moe.algos.profiling import CPU_INTERNAL_SCOPES, count_ops
from rl_moe.continual.networks import NETWORKS
from rl_moe.policies import MoEActorCriticPolicy
from rl_moe.regularizers.sphere import Sphere

OBS, ACT, BATCH = 39, 4, 256


class _Box(gym.Env):
    """Observation and action spaces of a MetaWorld task; the update benchmark never steps it."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (OBS,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (ACT,), np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):  # type: ignore[override]
        return np.zeros(OBS, np.float32), {}

    def step(self, action):  # type: ignore[override]
        return np.zeros(OBS, np.float32), 0.0, False, False, {}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _filled(model: BaseAlgorithm, rng: np.random.Generator) -> BaseAlgorithm:
    """Random rollout data, so ``train()`` can run without stepping envs."""
    buf = model.rollout_buffer  # type: ignore[attr-defined]
    buf.observations[:] = rng.standard_normal(buf.observations.shape)
    buf.actions[:] = rng.uniform(-1, 1, buf.actions.shape)
    for name in ("values", "returns", "advantages"):
        getattr(buf, name)[:] = rng.standard_normal(getattr(buf, name).shape)
    buf.log_probs[:] = -rng.uniform(2, 6, buf.log_probs.shape)
    buf.full = True
    model._current_progress_remaining = 1.0  # type: ignore[attr-defined]
    model.set_logger(configure(None, []))
    return model


def _moe_kwargs(n_experts: int, network: str) -> dict:
    """Top-K (K=2, 3 x 256) policy kwargs of the named network (init and gate widths)."""
    return dict(moe="topk", n_experts=n_experts, top_k=2, hidden=(256, 256, 256), **NETWORKS[network].settings)


def update_variants(device: str, n_experts: int, minibatches: int, static: bool, network: str = "authors") -> dict[str, BaseAlgorithm]:
    n_envs = 8
    kw = dict(n_steps=minibatches * BATCH // n_envs, batch_size=BATCH, n_epochs=1, device=device, seed=0, verbose=0)
    moe = _moe_kwargs(n_experts, network)
    rng = np.random.default_rng(0)

    def env() -> DummyVecEnv:
        return DummyVecEnv([_Box] * n_envs)

    def ours(regs: list, fast: str) -> BaseAlgorithm:
        model = _filled(MoEPPO(MoEActorCriticPolicy, env(), regularizers=regs, fast_update=fast, policy_kwargs=moe, **kw), rng)
        updater = model._fast_updater()
        if updater is not None and static:
            updater.static = True
        return model

    mlp = dict(net_arch=[256, 256, 256], activation_fn=torch.nn.ReLU)
    variants = {
        "sb3 mlp 3x256": _filled(PPO("MlpPolicy", env(), policy_kwargs=mlp, **kw), rng),
        "topk": ours([], "on"),
        "topk+sphere fixed": ours([Sphere(coef_mode="fixed", rank_every=0)], "on"),
        "topk+sphere": ours([Sphere(rank_every=0)], "on"),
        "topk (standard)": ours([], "off"),
        "topk+sphere (standard)": ours([Sphere(rank_every=0)], "off"),
    }
    return variants


def time_updates(variants: dict[str, BaseAlgorithm], device: str, rounds: int) -> dict[str, float]:
    """Median seconds per ``train()``, interleaved rounds; the first call (graph capture) is warm-up."""
    samples: dict[str, list[float]] = {k: [] for k in variants}
    for model in variants.values():
        model.train()
    for _ in range(rounds):
        for name, model in variants.items():
            _sync(device)
            t0 = time.perf_counter()
            model.train()
            _sync(device)
            samples[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in samples.items()}


def part_update(device: str, n_experts: int, minibatches: int, rounds: int, static: bool, network: str) -> None:
    variants = update_variants(device, n_experts, minibatches, static, network)
    secs = time_updates(variants, device, rounds)
    print(f"\nUpdate on {device}: {network} network, E={n_experts}, K=2, 3x256, {minibatches} minibatches of {BATCH} per train(), median of {rounds}")
    print(f"  {'variant':<24} {'ms/minibatch':>12} {'x topk':>7} {'x mlp':>7} {'ops':>7} {'launches':>9} {'syncs':>6}  path")
    for name, model in variants.items():
        counts = count_ops(model.train, exclude_scopes=CPU_INTERNAL_SCOPES if device == "cpu" else ())
        ops, launches, syncs = counts.per(minibatches)
        fast = model._fast_updater() if isinstance(model, MoEPPO) else None
        path = "sb3" if not isinstance(model, MoEPPO) else "sb3 batches" if fast is None else "device batches" + (" static" if fast.static else "")
        ms = 1e3 * secs[name] / minibatches
        print(
            f"  {name:<24} {ms:12.3f} {secs[name] / secs['topk']:7.2f} {secs[name] / secs['sb3 mlp 3x256']:7.2f} "
            f"{ops:7.0f} {launches:9.1f} {syncs:6.2f}  {path}"
        )


def rollout_variants(device: str, n_envs: int, n_steps: int, network: str = "authors") -> dict[str, BaseAlgorithm]:
    """Learners whose ``collect_rollouts`` is timed on envs that cost nothing to step."""
    kw = dict(n_steps=n_steps, batch_size=BATCH, n_epochs=1, device=device, seed=0, verbose=0)
    moe = _moe_kwargs(10, network)

    def env() -> DummyVecEnv:
        return DummyVecEnv([_Box] * n_envs)

    def ours(fast: str, device_buffer: bool) -> BaseAlgorithm:
        # device_buffer=False: SB3's RolloutBuffer and an eager policy call (with the static layout
        # where the device update runs)
        extra = {} if device_buffer else {"rollout_buffer_class": RolloutBuffer}
        model = MoEPPO(MoEActorCriticPolicy, env(), regularizers=[], fast_update=fast, policy_kwargs=moe, **kw, **extra)
        if not device_buffer:
            model._acting_graph = lambda: None  # type: ignore[method-assign]
        return model

    mlp = dict(net_arch=[256, 256, 256], activation_fn=torch.nn.ReLU)
    variants = {
        "sb3 mlp 3x256": PPO("MlpPolicy", env(), policy_kwargs=mlp, **kw),
        "topk, device buffer+graph": ours("on", True),
        "topk, sb3 buffer": ours("on", False),
        "topk (standard)": ours("off", False),
    }
    return variants


def part_rollout(device: str, n_envs: int, n_steps: int, rounds: int, network: str) -> None:
    """Per env step: time, ops, launches and host syncs of acting plus SB3's buffer work."""
    variants = rollout_variants(device, n_envs, n_steps, network)

    def collect(model: BaseAlgorithm) -> Callable[[], None]:
        _, callback = model._setup_learn(n_envs * n_steps, None)  # first observations, logger, callback
        return lambda: model.collect_rollouts(model.env, callback, model.rollout_buffer, n_steps)  # type: ignore[attr-defined]

    calls = {name: collect(model) for name, model in variants.items()}
    samples: dict[str, list[float]] = {k: [] for k in variants}
    for fn in calls.values():
        fn()  # warm-up (and the graph capture)
    for _ in range(rounds):
        for name, fn in calls.items():
            _sync(device)
            t0 = time.perf_counter()
            fn()
            _sync(device)
            samples[name].append(time.perf_counter() - t0)
    secs = {k: statistics.median(v) for k, v in samples.items()}
    print(f"\nRollout on {device}: {network} network, {n_envs} envs x {n_steps} steps of a no-op env, E=10, K=2, 3x256, median of {rounds}")
    print(f"  {'variant':<26} {'ms/step':>8} {'x device':>9} {'ops':>7} {'launches':>9} {'syncs':>6}  syncs by name")
    for name, fn in calls.items():
        counts = count_ops(fn)
        ops, launches, syncs = counts.per(n_steps)
        ms = 1e3 * secs[name] / n_steps
        by_name = ", ".join(f"{k} {v / n_steps:.2f}" for k, v in sorted(counts.sync_names.items()))
        print(f"  {name:<26} {ms:8.3f} {secs[name] / secs['topk, device buffer+graph']:9.2f} {ops:7.1f} {launches:9.1f} {syncs:6.2f}  {by_name}")


def part_e2e(device: str, suite_name: str, task: str, n_envs: int, n_steps: int, updates: int, vec_env: str) -> None:
    from rl_moe.continual.agents import begin_task, build_model
    from rl_moe.envs.factories import make_vec_env, task_factories
    from rl_moe.continual.probe_states import collect_probe_states, make_probe_callback, probe_factories
    from rl_moe.continual.resolve import RunRequest, resolve, suite_of

    overrides = (f"ppo.n_envs={n_envs}", f"ppo.n_steps={n_steps}")
    cfgs = {m: resolve(RunRequest(suite=suite_name, method=m, tasks=1, device=device, vec_env=vec_env, overrides=overrides)) for m in ("sphere", "topk")}
    suite = suite_of(cfgs["sphere"])
    spec = next(t for t in suite.tasks if t.name == task)
    steps = n_envs * n_steps * updates
    pcfg = cfgs["sphere"].probe
    probe = collect_probe_states(probe_factories(suite, 99), pcfg.n_states, stride=pcfg.stride, policy=pcfg.policy, noise=pcfg.noise)

    def env():
        return make_vec_env(task_factories(suite, spec, n_envs, 0), vec_env)

    def run(make: Callable[[], tuple[BaseAlgorithm, object]]) -> float:
        model, callback = make()
        model.learn(n_envs * n_steps, reset_num_timesteps=False, callback=callback)  # warm-up: one rollout + update
        begin = time.perf_counter()
        model.learn(steps, reset_num_timesteps=False, callback=callback)
        rate = steps / (time.perf_counter() - begin)
        model.get_env().close()
        return rate

    def ours(method: str, with_probe: bool) -> Callable[[], tuple[BaseAlgorithm, object]]:
        def make():
            model = build_model(cfgs[method], env(), device)
            begin_task(model, cfgs[method], 0, 0)
            # The CLI probes every steps_per_task / 10 (100k steps); here after every update.
            return model, make_probe_callback(probe, n_envs * n_steps) if with_probe else None

        return make

    def sb3():
        p = cfgs["topk"].ppo
        return PPO("MlpPolicy", env(), n_steps=n_steps, batch_size=p.batch_size, n_epochs=p.n_epochs, learning_rate=3e-4,
                   ent_coef=0.0, device="cpu", seed=0, verbose=0), None  # fmt: skip

    rates = {"sb3 mlp (cpu)": run(sb3), "topk": run(ours("topk", False)), "topk+sphere": run(ours("sphere", False))}
    rates["topk+sphere+probe"] = run(ours("sphere", True))
    print(f"\nEnd to end, {suite_name} {task} ({cfgs['topk'].net.init} init, gate {cfgs['topk'].net.gate_hidden}): {n_envs} envs ({vec_env}) x {n_steps} steps, {updates} updates after a warm-up one")
    for name, rate in rates.items():
        print(f"  {name:<20} {rate:8.0f} env steps/s   {rate / rates['sb3 mlp (cpu)']:5.2f}x sb3 mlp (cpu)")
    print(f"  SPHERE end-to-end overhead: {rates['topk'] / rates['topk+sphere'] - 1:+.1%}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--experts", type=int, nargs="+", default=[10])
    p.add_argument("--minibatches", type=int, default=16)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--skip-update", action="store_true")
    p.add_argument("--skip-e2e", action="store_true")
    p.add_argument("--skip-rollout", action="store_true")
    p.add_argument("--static", action="store_true", help="static-shape MoE layers on a CPU too (the GPU layout)")
    p.add_argument("--network", default="authors", choices=sorted(NETWORKS), help="parts 1 and 3: the MoE actor's network")
    p.add_argument("--suite", default="cw10", help="part 2: the suite whose network, PPO settings and probe tasks are used")
    p.add_argument("--task", default="hammer-v3")
    p.add_argument("--n-envs", type=int, default=8)
    p.add_argument("--n-steps", type=int, default=2048)
    p.add_argument("--updates", type=int, default=2)
    p.add_argument("--vec-env", default="dummy")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (the CLI uses 1)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if not args.skip_update:
        for e in args.experts:
            part_update(args.device, e, args.minibatches, args.rounds, args.static, args.network)
    if not args.skip_rollout:
        part_rollout(args.device, args.n_envs, 256, args.rounds, args.network)
    if not args.skip_e2e:
        part_e2e(args.device, args.suite, args.task, args.n_envs, args.n_steps, args.updates, args.vec_env)


if __name__ == "__main__":
    main()
