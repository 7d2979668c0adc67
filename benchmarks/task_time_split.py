"""Where a ``cw10`` task's wall time goes, measured in one run and projected onto one 1M-step task
under the CLI's schedule, with the physical limit of that task measured in the same run.

Builds Top-K + SPHERE as ``python -m rl_moe.crl --suite cw10`` does (the authors' network, 8 envs
on the official envs' fast path, separate clipping) and times, on each task asked:

- env stepping and acting (the policy's forward and SB3's buffer work) inside real rollouts,
  split by timing ``VecEnv.step`` within ``collect_rollouts``, and the policy's forward passes
  within acting (acting over them is acting's overhead beyond the forward it needs);
- the PPO update over one rollout, with SPHERE and with its ρ = 0 (the difference is SPHERE's
  penalty and its second backward), the two learners' rollouts alternated and their medians taken;
- the update's matrix products replayed alone at their own shapes (the update's floor on this core);
- one deterministic evaluation episode (5 eval envs, the run's evaluator, on envs built once and
  reused as the scheduler does; building them is counted once per position view), one probe of the
  plasticity diagnostics, one in-task checkpoint's capture and write, and the task-end
  checkpoint.

The limit is what the task cannot go below on this core: the update's matrix products at the
1024² matmul rate measured in the same run, MuJoCo's own ``mj_step`` × frame skip per env step (on
the task's model, nothing else of the env), and one no-grad forward pass of the policy per vec-env
step (acting's floor). Each part's time is printed as a ratio to its floor, and the task's time as a
ratio to the sum.

Every part is timed in this thread's CPU time, so that the neighbours' share of the core does not
move the split; the checkpoints' writes alone in wall time, which includes their wait for the disk.

The projection uses the CLI's defaults: 62 rollouts of 16,384 steps, 10 periodic evaluations of
10 episodes on two position views plus the success-matrix row, a probe at every periodic
evaluation, an in-task checkpoint captured at every rollout and written every 100,000 steps,
the model saved at the task's end. Rollouts here are ``--n-steps`` per env
(default 256, one minibatch per 25.6 env steps as in the paper's 8 × 2048); the update is scaled
by the number of minibatches.

    OMP_NUM_THREADS=1 python benchmarks/task_time_split.py [--tasks hammer-v3 push-wall-v3 faucet-close-v3] [--rounds 4]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from rl_moe.continual import intask
from rl_moe.continual.agents import begin_task, build_model
from rl_moe.continual.evaluation import EvalEnvs, evaluate
from rl_moe.continual.probe_states import collect_probe_states, make_probe_callback, probe_factories
from rl_moe.continual.resolve import RunRequest, resolve, suite_of
from rl_moe.continual.rng import env_seed
from rl_moe.envs.factories import make_vec_env, task_factories

sys.path.insert(0, os.path.dirname(__file__))
from _timing import best_seconds, interleaved_medians, paper_task_steps  # noqa: E402

TASK_STEPS = paper_task_steps()
#: This thread's time on the core: the process is single-threaded (one torch thread, the envs in
#: process), so each part's cost does not depend on the share of the core the neighbours leave it.
CLOCK = time.thread_time
_CLI_PPO = resolve(RunRequest(suite="cw10", device="cpu")).ppo
#: Env steps of one rollout as the CLI collects it (8 × 2048): an in-task capture ends each.
CLI_ROLLOUT = _CLI_PPO.n_envs * _CLI_PPO.n_steps


class _EnvClock:
    """Times ``VecEnv.step`` of one vec env (the env's share of a rollout)."""

    def __init__(self, env) -> None:  # type: ignore[no-untyped-def]
        self.seconds = 0.0
        self._step = env.step

        def timed(actions):  # type: ignore[no-untyped-def]
            t0 = CLOCK()
            out = self._step(actions)
            self.seconds += CLOCK() - t0
            return out

        env.step = timed


def _learner(task_name: str, rho: float | None, n_steps: int):  # type: ignore[no-untyped-def]
    overrides = (f"ppo.n_steps={n_steps}",) + (() if rho is None else (f"reg.sphere.rho={rho}",))
    cfg = resolve(RunRequest(suite="cw10", method="sphere", tasks=10, vec_env="dummy", device="cpu", overrides=overrides))
    suite = suite_of(cfg)
    task = next(t for t in suite.tasks if t.name == task_name)
    env = make_vec_env(task_factories(suite, task, cfg.ppo.n_envs, 0), "dummy")
    model = build_model(cfg, env, "cpu")
    begin_task(model, cfg, 0, 0)
    return cfg, suite, task, model, env


class _Cycles:
    """Times one learner's rollout-plus-update cycles: (env, acting, update, the policy's forward
    passes within acting) seconds of each."""

    def __init__(self, model, env, n_steps: int) -> None:  # type: ignore[no-untyped-def]
        self.model, self.steps = model, env.num_envs * n_steps
        self.clock = _EnvClock(env)
        self.train = self.forward = 0.0
        model.learn(self.steps, reset_num_timesteps=False)  # warm-up: first forward, allocations
        original_train, original_forward = model.train, model.policy.forward

        def timed_train() -> None:
            t0 = CLOCK()
            original_train()
            self.train += CLOCK() - t0

        def timed_forward(*args, **kwargs):  # type: ignore[no-untyped-def]
            t0 = CLOCK()
            out = original_forward(*args, **kwargs)
            self.forward += CLOCK() - t0
            return out

        model.train = timed_train
        model.policy.forward = timed_forward  # the rollout's policy(obs); the update calls evaluate_actions

    def once(self) -> tuple[float, float, float, float]:
        self.clock.seconds = self.train = self.forward = 0.0
        t0 = CLOCK()
        self.model.learn(self.steps, reset_num_timesteps=False)
        total = CLOCK() - t0
        return self.clock.seconds, total - self.train - self.clock.seconds, self.train, self.forward


def _alternated(a: _Cycles, b: _Cycles, rounds: int) -> tuple[list[float], list[float]]:
    """Medians of (env, acting, update, forward) seconds per cycle of ``a`` and of ``b``, cycled in
    alternating order (a b b a ...) so that the neighbours' load hits both alike."""
    samples: tuple[list[tuple[float, float, float]], list[tuple[float, float, float]]] = ([], [])
    for r in range(rounds):
        for k in (0, 1) if r % 2 == 0 else (1, 0):
            samples[k].append((a, b)[k].once())
    return tuple([statistics.median(col) for col in zip(*rows)] for rows in samples)  # type: ignore[return-value]


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
            t0 = CLOCK()
            for op, args, count, _ in calls:
                for _ in range(count):
                    op(*args)
            times.append(CLOCK() - t0)
    return sorted(times)[len(times) // 2], float(sum(c[3] for c in calls)), sum(c[2] for c in calls), others[:8]


def _matmul_peak(n: int = 1024, reps: int = 4, rounds: int = 5) -> float:
    """This core's fp32 matmul rate (FLOP/s) on large square matrices: the update's ceiling. The
    best of a few short rounds, since a shared core's slow rounds measure the neighbours."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / best_seconds(lambda: torch.mm(a, b), reps, rounds, CLOCK)


def _mujoco_floor(env, reps: int = 400) -> float:  # type: ignore[no-untyped-def]
    """Seconds of MuJoCo's own physics per env step: ``mj_step`` × the env's frame skip on the
    task's model, from a state the env reached (nothing of MetaWorld's Python around it)."""
    import mujoco

    inner = env.envs[0].unwrapped
    data = mujoco.MjData(inner.model)
    data.qpos[:], data.qvel[:], data.mocap_pos[:], data.mocap_quat[:] = inner.data.qpos, inner.data.qvel, inner.data.mocap_pos, inner.data.mocap_quat
    mujoco.mj_step(inner.model, data, nstep=inner.frame_skip)
    t0 = CLOCK()
    for _ in range(reps):
        mujoco.mj_step(inner.model, data, nstep=inner.frame_skip)
    return (CLOCK() - t0) / reps


def _forward_floor(model, env) -> float:  # type: ignore[no-untyped-def]
    """Seconds per env step of acting's floor: one no-grad forward of the policy (actions, values,
    log-probabilities, as SB3's rollout asks) on a batch of the vec env's observations."""
    obs = torch.as_tensor(env.reset(), dtype=torch.float32)  # values do not change a dense forward's cost

    def forward() -> None:
        with torch.no_grad():
            model.policy(obs)

    return interleaved_medians({"forward": forward}, rounds=7, inner=20, clock=CLOCK)["forward"] / env.num_envs


def _once_per_task_costs(cfg: Any, suite: Any, task: Any, model: Any, env: Any) -> tuple[float, float, float, float, float, float]:
    """Seconds of one evaluation episode, of building the eval envs, of one probe, and of an
    in-task checkpoint's capture and write and the task-end checkpoint."""
    # As the scheduler evaluates: the task's eval envs built once (per position view) and
    # reseeded before every evaluation, so building them is a once-per-task cost.
    pool = EvalEnvs(task_factories(suite, task, cfg.eval.n_envs, env_seed(0, "eval")), "dummy")
    t0 = CLOCK()
    evaluate(model, pool, cfg.eval.n_envs)
    first = CLOCK() - t0
    t0 = CLOCK()
    evaluate(model, pool, cfg.eval.n_envs)
    episode = (CLOCK() - t0) / cfg.eval.n_envs
    build_s = max(0.0, first - episode * cfg.eval.n_envs)
    pool.close()
    states = collect_probe_states(probe_factories(suite, env_seed(0, "probe")), cfg.probe.n_states, stride=cfg.probe.stride, policy=cfg.probe.policy, noise=cfg.probe.noise)
    probe = make_probe_callback(states, 1, config=cfg.probe)
    probe.init_callback(model)
    probe._on_training_start()
    t0 = CLOCK()
    probe.compute()
    probe_s = CLOCK() - t0
    with tempfile.TemporaryDirectory() as tmp:
        # The in-task checkpoint: captured at every rollout boundary, written every
        # checkpoint.every_steps; and the task-end checkpoint (the model's zip), once per task.
        t0 = time.perf_counter()
        state = intask.capture(model, env, 0, 0, {"steps": [0], "success": [0.0], "return": [0.0]}, {"eval": {"next_eval": 0}, "probe": None}, 0.0)
        t1 = time.perf_counter()
        intask.write(Path(tmp) / "in_task.pkl", state)
        t2 = time.perf_counter()
        model.save(Path(tmp) / "ckpt.zip")
        capture_s, write_s, final_s = t1 - t0, t2 - t1, time.perf_counter() - t2
    return episode, build_s, probe_s, capture_s, write_s, final_s


def _split(task_name: str, rounds: int, n_steps: int) -> None:
    """Measure one task's parts and its limit, and print them."""
    cfg, suite, task, model, env = _learner(task_name, None, n_steps)
    _, _, _, plain_model, plain_env = _learner(task_name, 0.0, n_steps)
    (env_s, act_s, upd_sphere, act_fwd_s), (_, _, upd_topk, _) = _alternated(_Cycles(model, env, n_steps), _Cycles(plain_model, plain_env, n_steps), rounds)
    steps_per_rollout = env.num_envs * n_steps
    flops = _update_flops(model)
    replay_s, replay_flops, n_products, others = _matmul_replay(model)
    peak = _matmul_peak()  # beside the replay, so that both see the same load

    episode, build_s, probe_s, capture_s, write_s, final_s = _once_per_task_costs(cfg, suite, task, model, env)
    mj_s = _mujoco_floor(env)
    fwd_s = _forward_floor(model, env)

    rollouts_per_task = TASK_STEPS / steps_per_rollout
    views = 2 if cfg.eval.positions == "both" else 1  # position views scored, each on its own env set
    evals = (cfg.eval.evals_per_task * cfg.eval.n_episodes + cfg.eval.matrix_episodes) * views
    writes = math.ceil(TASK_STEPS / cfg.checkpoint.every_steps)
    parts = {
        "env stepping": env_s * rollouts_per_task,
        "acting (policy forward, SB3 buffer)": act_s * rollouts_per_task,
        "PPO update without SPHERE": upd_topk * rollouts_per_task,
        "SPHERE's penalty and second backward": max(0.0, upd_sphere - upd_topk) * rollouts_per_task,
        f"evaluation ({evals} episodes, {views} env sets built)": episode * evals + build_s * views,
        f"probe ({cfg.eval.evals_per_task}×)": probe_s * cfg.eval.evals_per_task,
        f"checkpoints ({writes} in-task writes, the task's end)": capture_s * TASK_STEPS / CLI_ROLLOUT + write_s * writes + final_s,
    }
    total = sum(parts.values())
    floors = {"update (products at the 1024² rate)": (upd_sphere, flops / peak), "stepping (mj_step × frame skip)": (env_s, mj_s * steps_per_rollout),
              "acting (one no-grad forward per vec step)": (act_s, fwd_s * steps_per_rollout)}  # fmt: skip
    limit = sum(f for _, f in floors.values()) * rollouts_per_task
    print(f"{suite.name} {task.name}, Top-K + SPHERE as the CLI builds it ({', '.join(f'{k} {v}' for k, v in cfg.labels().items())}), 1 thread; median of {rounds} alternated rollouts of "
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
    print(f"  limit: {limit / 60:.1f} min for the task; today's task is {total / limit:.2f}× it (the limit is {limit / total:.2f}× today's task)")
    for name, (today, floor) in floors.items():
        print(f"    {name:<44} today {today / floor:5.2f}× its floor")
    print(f"    acting / the policy's own forward passes in the same rollouts: {act_s / act_fwd_s:.2f}×")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", nargs="+", default=["hammer-v3", "push-wall-v3", "faucet-close-v3"], help="the slice's three tasks by default")
    p.add_argument("--rounds", type=int, default=4, help="rollouts of each learner (with SPHERE, with ρ = 0), alternated")
    p.add_argument("--n-steps", type=int, default=256)
    args = p.parse_args()
    torch.set_num_threads(1)
    for task in args.tasks:
        _split(task, args.rounds, args.n_steps)


if __name__ == "__main__":
    main()
