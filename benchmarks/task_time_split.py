"""Where a ``cw10-paper`` task's wall time goes, measured in one run and projected onto one 1M-step
task under the CLI's schedule (issue: MetaWorld at the speed of its physics, item 4).

Builds Top-K + SPHERE as ``python -m rl_moe.crl --suite cw10-paper`` does (8 envs on the official
envs' fast path, separate clipping) and times, on one task:

- env stepping and acting (the policy's forward and SB3's buffer work) inside real rollouts,
  split by timing ``VecEnv.step`` within ``collect_rollouts``;
- the PPO update over one rollout, with SPHERE and with its ρ = 0 (the difference is SPHERE's
  penalty and its second backward);
- the update's matrix products replayed alone at their own shapes (the update's floor on this core);
- one deterministic evaluation episode (5 eval envs, the run's evaluator), one probe of the
  plasticity diagnostics, one checkpoint write.

The projection uses the CLI's defaults: 62 rollouts of 16,384 steps, 10 periodic evaluations of
10 episodes on two position views plus the success-matrix row, a probe at every periodic
evaluation, an in-task checkpoint every 100,000 steps. Rollouts here are ``--n-steps`` per env
(default 256, one minibatch per 25.6 env steps as in the paper's 8 × 2048); the update is scaled
by the number of minibatches.

    OMP_NUM_THREADS=1 python benchmarks/task_time_split.py [--task push-wall-v3] [--rollouts 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from rl_moe.continual.agents import begin_task, build_model
from rl_moe.continual.evaluation import evaluate
from rl_moe.continual.probe_states import collect_probe_states, make_probe_callback, probe_factories
from rl_moe.continual.resolve import RunRequest, resolve, suite_of
from rl_moe.continual.rng import env_seed
from rl_moe.envs.factories import make_vec_env, task_factories

sys.path.insert(0, os.path.dirname(__file__))
from _timing import paper_task_steps  # noqa: E402

TASK_STEPS = paper_task_steps()


class _EnvClock:
    """Times ``VecEnv.step`` of one vec env (the env's share of a rollout)."""

    def __init__(self, env) -> None:  # type: ignore[no-untyped-def]
        self.seconds = 0.0
        self._step = env.step

        def timed(actions):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            out = self._step(actions)
            self.seconds += time.perf_counter() - t0
            return out

        env.step = timed


def _learner(task_name: str, rho: float | None, n_steps: int):  # type: ignore[no-untyped-def]
    overrides = (f"ppo.n_steps={n_steps}",) + (() if rho is None else (f"reg.sphere.rho={rho}",))
    cfg = resolve(RunRequest(suite="cw10-paper", method="sphere", tasks=10, vec_env="dummy", device="cpu", overrides=overrides))
    suite = suite_of(cfg)
    task = next(t for t in suite.tasks if t.name == task_name)
    env = make_vec_env(task_factories(suite, task, cfg.ppo.n_envs, 0), "dummy")
    model = build_model(cfg, env, "cpu")
    begin_task(model, cfg, 0, 0)
    return cfg, suite, task, model, env


def _cycle(model, env, rollouts: int, n_steps: int) -> tuple[float, float, float]:  # type: ignore[no-untyped-def]
    """(env seconds, acting seconds, update seconds) per rollout."""
    clock = _EnvClock(env)
    collect = train = 0.0
    model.learn(env.num_envs * n_steps, reset_num_timesteps=False)  # warm-up: first forward, allocations
    clock.seconds = 0.0
    original_train = model.train

    def timed_train() -> None:
        nonlocal train
        t0 = time.perf_counter()
        original_train()
        train += time.perf_counter() - t0

    model.train = timed_train
    t0 = time.perf_counter()
    model.learn(rollouts * env.num_envs * n_steps, reset_num_timesteps=False)
    total = time.perf_counter() - t0
    collect = total - train
    return clock.seconds / rollouts, (collect - clock.seconds) / rollouts, train / rollouts


def _update_flops(model) -> float:  # type: ignore[no-untyped-def]
    """Floating-point operations of one PPO update (matmuls as torch's profiler counts them)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_flops=True) as prof:
        model.train()
    return float(sum(e.flops for e in prof.key_averages() if e.flops))


#: The matrix products of an update as torch's profiler names them, and how to replay each alone
#: from its recorded input shapes (the first N tensors; addmm's beta/alpha show as empty shapes).
MATMULS = {"aten::mm": (torch.mm, 2), "aten::addmm": (torch.addmm, 3), "aten::bmm": (torch.bmm, 2), "aten::baddbmm": (torch.baddbmm, 3)}


def _matmul_replay(model, rounds: int = 3) -> tuple[float, float, int, list[tuple[str, float]]]:  # type: ignore[no-untyped-def]
    """One update's matrix products replayed alone, at their own shapes and counts (contiguous
    random operands, no autograd, no other op between them): (seconds, FLOP, products). The
    update cannot run faster than this on this core; the rest of its time is everything else
    (routing, gathers, elementwise work, autograd's bookkeeping, Adam), whose largest ops by self
    time (under the profiler, which inflates small ops) come last: [(op, share of the profiled time)]."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True, with_flops=True) as prof:
        model.train()
    calls = []
    for e in prof.key_averages(group_by_input_shape=True):
        if e.key in MATMULS:
            op, n_in = MATMULS[e.key]
            shapes = [s for s in e.input_shapes if len(s) > 0][:n_in]
            calls.append((op, [torch.randn(*s) for s in shapes], e.count, e.flops))
    averages = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in averages)
    others = sorted(((e.key, e.self_cpu_time_total / total) for e in averages if e.key not in MATMULS), key=lambda kv: -kv[1])
    times = []
    with torch.no_grad():
        for _ in range(rounds):
            t0 = time.perf_counter()
            for op, args, count, _ in calls:
                for _ in range(count):
                    op(*args)
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2], float(sum(c[3] for c in calls)), sum(c[2] for c in calls), others[:8]


def _matmul_peak(n: int = 1024, reps: int = 10) -> float:
    """This core's fp32 matmul rate (FLOP/s) on large square matrices: the update's ceiling."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    t0 = time.perf_counter()
    for _ in range(reps):
        torch.mm(a, b)
    return 2 * n**3 * reps / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="push-wall-v3")
    p.add_argument("--rollouts", type=int, default=2)
    p.add_argument("--n-steps", type=int, default=256)
    args = p.parse_args()
    torch.set_num_threads(1)

    cfg, suite, task, model, env = _learner(args.task, None, args.n_steps)
    env_s, act_s, upd_sphere = _cycle(model, env, args.rollouts, args.n_steps)
    _, _, _, plain_model, plain_env = _learner(args.task, 0.0, args.n_steps)
    _, _, upd_topk = _cycle(plain_model, plain_env, args.rollouts, args.n_steps)
    steps_per_rollout = env.num_envs * args.n_steps
    flops = _update_flops(model)
    peak = _matmul_peak()
    replay_s, replay_flops, n_products, others = _matmul_replay(model)

    factories = task_factories(suite, task, cfg.eval.n_envs, env_seed(0, "eval"))
    t0 = time.perf_counter()
    evaluate(model, factories, cfg.eval.n_envs, None, "dummy")
    episode = (time.perf_counter() - t0) / cfg.eval.n_envs
    states = collect_probe_states(probe_factories(suite, env_seed(0, "probe")), cfg.probe.n_states, stride=cfg.probe.stride, policy=cfg.probe.policy, noise=cfg.probe.noise)
    probe = make_probe_callback(states, 1, config=cfg.probe)
    probe.init_callback(model)
    probe._on_training_start()
    t0 = time.perf_counter()
    probe.compute()
    probe_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        model.save(Path(tmp) / "ckpt.zip")
        ckpt_s = time.perf_counter() - t0

    rollouts = TASK_STEPS / steps_per_rollout
    evals = cfg.eval.evals_per_task * cfg.eval.n_episodes * 2 + cfg.eval.matrix_episodes * 2
    parts = {
        "env stepping": env_s * rollouts,
        "acting (policy forward, SB3 buffer)": act_s * rollouts,
        "PPO update without SPHERE": upd_topk * rollouts,
        "SPHERE's penalty and second backward": max(0.0, upd_sphere - upd_topk) * rollouts,
        f"evaluation ({evals} episodes)": episode * evals,
        f"probe ({cfg.eval.evals_per_task}×)": probe_s * cfg.eval.evals_per_task,
        "in-task checkpoints (10×)": ckpt_s * 10,
    }
    total = sum(parts.values())
    print(f"{suite.name} {task.name}, Top-K + SPHERE as the CLI builds it, 1 thread; measured over {args.rollouts} rollouts of "
          f"{steps_per_rollout:,} steps, projected onto one {TASK_STEPS:,}-step task ({total / 60:.1f} min)")  # fmt: skip
    for name, seconds in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<40} {seconds:8.1f} s  {100 * seconds / total:5.1f}%")
    print(f"  per env step: env {1e3 * env_s / steps_per_rollout:.3f} ms, acting {1e3 * act_s / steps_per_rollout:.3f} ms, "
          f"update {1e3 * upd_sphere / steps_per_rollout:.3f} ms (of which SPHERE {1e3 * max(0.0, upd_sphere - upd_topk) / steps_per_rollout:.3f} ms)")  # fmt: skip
    print(f"  the update's matmuls: {flops / 1e9:.1f} GFLOP per rollout at {flops / upd_sphere / 1e9:.1f} GFLOP/s, "
          f"{100 * flops / upd_sphere / peak:.0f}% of this core's measured fp32 matmul peak ({peak / 1e9:.1f} GFLOP/s, 1024² × 1024²)")  # fmt: skip
    print(f"  the same {n_products:,} matrix products ({replay_flops / 1e9:.1f} GFLOP) replayed alone at their own shapes: "
          f"{replay_s:.2f} s per rollout, {replay_flops / replay_s / 1e9:.1f} GFLOP/s ({100 * replay_flops / replay_s / peak:.0f}% of the 1024² peak); "
          f"they are {100 * replay_s / upd_sphere:.0f}% of the update's {upd_sphere:.2f} s, the rest ({upd_sphere - replay_s:.2f} s) is everything else")  # fmt: skip
    print("  the largest other ops by self time under the profiler: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in others))


if __name__ == "__main__":
    main()
