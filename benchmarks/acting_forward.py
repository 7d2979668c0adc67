"""The rollout's policy call alone, this checkout against a baseline checkout, in one run.

Acting in a ``cw10`` rollout is SB3's ``policy(obs)`` at batch ``n_envs`` = 8 without autograd:
the authors' network (a 3 × 256 gate, Top-K over E = 10 experts of 3 × 256, K = 2) for the action
mean, the dense 3 × 256 critic, the Gaussian's sample and log-probability. At that batch the call
is dispatch-bound (its products are about 0.3 ms of work at this core's matmul rate), so a change
to its bookkeeping shows here long before it shows in ``task_speed.py``'s task ratio, whose
parts move by ±5–15% with the neighbours' load.

Two worker processes, one importing this checkout's ``rl_moe`` and one a baseline's
(``--baseline``, a ``git worktree`` of the older commit), each build the learner as
``python -m rl_moe.crl --suite cw10 --method topk`` does (``--method`` picks another), collect one
rollout (so that routing is the trained-from-init routing of real states), and then time
``--calls`` policy calls on those states per round, in thread CPU time, inside the scope a rollout
holds open where the checkout has one (``rl_moe.nn.reuse.weights_fixed``: values of the weights
alone are computed once per round). Rounds alternate a b b a; the ratio is the median of the
per-pair ratios. Both workers' actions on the same states and seed are compared bit for bit.

The same rounds also time acting as each checkout's rollout does it: SB3's ``collect_rollouts``
(the policy call under whatever the checkout's rollout wraps it in, SB3's buffer and callbacks)
over the recorded rollout, with the env's steps replayed from the recording instead of simulated,
so that MuJoCo's time and its noise stay out. The policy's own forward passes are timed inside
it, so acting / forward is acting's overhead beyond the forward it needs (the performance goal:
≤ 1.5).

    git worktree add --detach /tmp/rl_moe-base <commit>
    OMP_NUM_THREADS=1 python benchmarks/acting_forward.py --baseline /tmp/rl_moe-base [--task hammer-v3] [--rounds 8] [--method topk]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

sys.path.insert(0, str(HERE))
from _workers import ROOT, alternated, baseline_pair, describe  # noqa: E402  (a sibling module of this script)


def _copied(step: tuple) -> tuple:  # type: ignore[type-arg]
    """A copy of one ``step_wait`` result: its arrays and the infos' list (the env reuses them)."""
    return tuple(x.copy() if hasattr(x, "copy") else x for x in step)


def _recorded_learner(task_name: str, method: str) -> tuple[Any, Any, list[tuple], Callable[[], tuple]]:  # type: ignore[type-arg]
    """``method``'s learner, from whichever ``rl_moe`` is first on the path, after one rollout of
    real states on ``task_name`` (its weights left at their init); its env, whose ``step_wait``
    records every step into the list returned beside it, and that recording ``step_wait``."""
    import torch

    from rl_moe.continual.agents import begin_task, build_model
    from rl_moe.continual.resolve import RunRequest, resolve, suite_of
    from rl_moe.envs.factories import make_vec_env, task_factories

    torch.set_num_threads(1)
    cfg = resolve(RunRequest(suite="cw10", method=method, tasks=10, vec_env="dummy", device="cpu", overrides=("ppo.n_steps=256",)))
    suite = suite_of(cfg)
    task = next(t for t in suite.tasks if t.name == task_name)
    env = make_vec_env(task_factories(suite, task, cfg.ppo.n_envs, 0), "dummy")
    model = build_model(cfg, env, "cpu")
    begin_task(model, cfg, 0, 0)
    model.train = lambda: None  # one rollout of real states; the weights stay at their init
    recorded: list[tuple] = []  # type: ignore[type-arg]
    real_step_wait = env.step_wait

    def recording_step_wait():  # type: ignore[no-untyped-def]
        out = real_step_wait()
        recorded.append(_copied(out))
        return out

    env.step_wait = recording_step_wait
    model.learn(env.num_envs * 256, reset_num_timesteps=False)
    return model, env, recorded, recording_step_wait


def _worker(task_name: str, calls: int, method: str) -> None:
    """Build ``method``'s learner (:func:`_recorded_learner`); per ``time`` line on stdin print the
    thread CPU seconds of ``calls`` policy calls, per ``rollout`` line the seconds of acting over the
    recorded rollout and of the policy's forward passes in it, per ``actions`` line a digest of the
    sampled actions on fixed states and seed."""
    import torch

    import rl_moe

    try:  # the scope a rollout holds open, in checkouts that have one (rl_moe.nn.reuse)
        from rl_moe.nn.reuse import weights_fixed as rollout_scope
    except ImportError:
        from contextlib import nullcontext as rollout_scope
    model, env, recorded, recording_step_wait = _recorded_learner(task_name, method)
    states = torch.as_tensor(model.rollout_buffer.observations[:, :, :], dtype=torch.float32)  # (T, n_envs, obs)
    policy = model.policy
    replay = iter(())

    def replayed_step_wait():  # type: ignore[no-untyped-def]
        return next(replay)

    forward_seconds = [0.0]
    real_forward = policy.forward

    def timed_forward(*args, **kwargs):  # type: ignore[no-untyped-def]
        t0 = time.thread_time()
        out = real_forward(*args, **kwargs)
        forward_seconds[0] += time.thread_time() - t0
        return out

    print(json.dumps({"ready": str(Path(rl_moe.__file__).parent)}), flush=True)
    for line in sys.stdin:
        if line.strip() == "rollout":
            replay = iter([_copied(step) for step in recorded])  # a rollout may write into what it was given
            env.step_wait, policy.forward, forward_seconds[0] = replayed_step_wait, timed_forward, 0.0
            t0 = time.thread_time()
            model.learn(env.num_envs * len(recorded), reset_num_timesteps=False)
            seconds = time.thread_time() - t0
            env.step_wait, policy.forward = recording_step_wait, real_forward
            print(json.dumps({"seconds": seconds, "forward": forward_seconds[0]}), flush=True)
            continue
        with torch.no_grad(), rollout_scope():
            if line.strip() == "actions":
                torch.manual_seed(0)
                digest = hashlib.sha256()
                for obs in states:
                    digest.update(policy(obs)[0].numpy().tobytes())
                print(json.dumps({"actions": digest.hexdigest()[:16]}), flush=True)
                continue
            t0 = time.thread_time()
            for i in range(calls):
                policy(states[i % len(states)])
            print(json.dumps({"seconds": time.thread_time() - t0}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", type=Path, help="a checkout of the commit to compare against (e.g. a git worktree)")
    p.add_argument("--task", default="hammer-v3")
    p.add_argument("--rounds", type=int, default=8, help="timed rounds per checkout, alternated a b b a")
    p.add_argument("--calls", type=int, default=500, help="policy calls per round")
    p.add_argument("--method", default="topk", help="the --method whose learner both checkouts build (default: topk)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        _worker(args.task, args.calls, args.method)
        return
    new, base = baseline_pair(args.baseline, "acting_forward.py", ["--task", args.task, "--calls", str(args.calls), "--method", args.method])
    commit = {"new": describe(ROOT), "base": describe(args.baseline)}
    same = new.ask("actions")["actions"] == base.ask("actions")["actions"]
    turns = alternated(new, base, lambda w: (float(w.ask("time")["seconds"]), w.ask("rollout")), args.rounds)
    seconds = {name: [t[0] for t in got] for name, got in turns.items()}
    rollouts = {name: [t[1] for t in got] for name, got in turns.items()}
    new.close()
    base.close()
    pairs = [n / b for n, b in zip(seconds["new"], seconds["base"])]
    per_call = {k: statistics.median(v) / args.calls * 1e3 for k, v in seconds.items()}
    print(f"cw10 {args.task}: --method {args.method} policy call at batch 8, no autograd, 1 thread, {args.rounds} alternated rounds of {args.calls} calls")
    print(f"  this checkout {commit['new']}: {per_call['new']:.3f} ms per call; baseline {commit['base']}: {per_call['base']:.3f} ms")
    print(f"  new / baseline: {statistics.median(pairs):.3f} (per-round ratios {min(pairs):.3f}–{max(pairs):.3f})")
    print(f"  sampled actions on the rollout's states, same seed: {'bit-identical' if same else 'DIFFERENT'}")
    acting = {k: [r["seconds"] for r in v] for k, v in rollouts.items()}
    pairs = [n / b for n, b in zip(acting["new"], acting["base"])]
    print("  acting as each checkout's rollout does it (SB3's collect_rollouts over the recorded rollout, env steps replayed):")
    print(f"    new / baseline: {statistics.median(pairs):.3f} (per-round ratios {min(pairs):.3f}–{max(pairs):.3f})")
    for name in ("new", "base"):
        over = statistics.median(r["seconds"] / r["forward"] for r in rollouts[name])
        print(f"    {name}: acting / the policy's forward passes in it: {over:.2f}×")


if __name__ == "__main__":
    main()
