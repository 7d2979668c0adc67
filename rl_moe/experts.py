"""``python -m rl_moe.experts``: which experts each task uses, and which experts each task moves.

Example::

    python -m rl_moe.experts runs/cw10/ppo-topk-crl-s0

For every task-end checkpoint i and every task j, the checkpoint's deterministic policy plays one
episode on each of task j's evaluation positions (the protocol's, as the run's own evaluation);
the states it visits go through the actor, and ``shares[i][j][e]`` is the share of the routed
rows (state, selected expert) that expert e receives. For every task k after the first,
``movement[k][e]`` is how far expert e's weights moved while task k trained: the norm of the
change of all its weights and biases between the checkpoints after tasks k-1 and k, over their
norm after task k-1. A MoE user reads forgetting off both: a new task taking over the experts an
earlier one relied on shows as a row of shares moving, and as those experts moving.

The result goes to ``RUN_DIR/experts.json``; nothing of the run is modified. The report draws it
(``python -m rl_moe.report``). Experts are not matched across seeds: expert 3 of one seed is not
expert 3 of another, so these are per-run figures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize
from torch import nn

from rl_moe import __version__
from rl_moe.atomic import write_json_atomic
from rl_moe.cli import EXIT_USAGE, UsageParser
from rl_moe.continual.run_view import RunView
from rl_moe.errors import UsageError
from rl_moe.run_reader import load_task_model, read_run
from rl_moe.nn import MoEOutput
from rl_moe.nn.experts import StackedExperts
from rl_moe.nn.reuse import weights_fixed
from rl_moe.provenance import code_version

#: The file the tool writes in the run folder.
EXPERTS_FILE = "experts.json"


def routed_shares(output: MoEOutput, n_experts: int) -> np.ndarray:
    """(E,) share of the routed rows (state, selected expert) each expert receives: a state
    routed to K experts counts once for each (``indices``, -1 padded)."""
    idx = output.indices.reshape(-1)
    counts = torch.bincount(idx[idx >= 0].to(torch.long), minlength=n_experts)[:n_experts].to(torch.float64)
    total = counts.sum()
    return (counts / total).numpy() if total > 0 else np.zeros(n_experts)


def actor_network(policy: nn.Module) -> nn.Module:
    """The MoE actor of a PPO or TD3 policy of this package.

    :raises UsageError: a policy without a routed actor
    """
    net = getattr(policy, "actor_net", None)
    if net is None:  # TD3: the actor's network
        net = getattr(getattr(policy, "actor", None), "mu", None)
    if net is None or not hasattr(net, "experts") or not isinstance(net.experts, StackedExperts):
        raise UsageError(f"{type(policy).__name__} has no routed MoE actor (stacked experts); python -m rl_moe.experts needs one")
    return net


def expert_vectors(net: nn.Module) -> torch.Tensor:
    """(E, P): every weight and bias of each expert of ``net`` (its stacked experts), flattened."""
    stack: StackedExperts = net.experts
    parts = [w.detach().reshape(w.shape[0], -1) for w in (*stack.weights, *stack.biases)]
    return torch.cat(parts, dim=1).to(torch.float64)


def movement(before: torch.Tensor, after: torch.Tensor) -> np.ndarray:
    """(E,) relative change of each expert: ||after_e - before_e|| / ||before_e||."""
    return ((after - before).norm(dim=1) / before.norm(dim=1).clamp_min(1e-12)).numpy()


def visited_states(model: Any, factories: list[Any], obs_rms: Any, max_steps: int | None) -> torch.Tensor:
    """The actor's inputs along one deterministic episode on each of ``factories`` (normalized as
    the run's actor sees them), at most ``max_steps`` steps each."""
    venv: Any = DummyVecEnv(factories)
    if obs_rms is not None:
        venv = VecNormalize(venv, training=False, norm_obs=True, norm_reward=False)
        venv.obs_rms = obs_rms
    states: list[np.ndarray] = []
    alive = np.ones(len(factories), dtype=bool)
    try:
        with weights_fixed():  # no weight changes during the episodes: reusable values are kept
            obs = venv.reset()
            t = 0
            while alive.any() and (max_steps is None or t < max_steps):
                states.append(obs[alive])
                actions, _ = model.predict(obs, deterministic=True)
                obs, _, dones, _ = venv.step(actions)
                alive &= ~dones  # one episode per position: an env that finished is not read again
                t += 1
    finally:
        venv.close()
    return torch.as_tensor(np.concatenate(states), dtype=torch.float32)


def usage(run_dir: Path, max_steps: int | None = None) -> dict[str, Any]:
    """``shares`` and ``movement`` of a run (module docstring)."""
    cfg, results = read_run(run_dir)
    finished = int(results.get("finished_tasks", 0))
    if finished < 1:
        raise UsageError(f"run {str(run_dir)!r} has no finished task (no checkpoint to read)")
    view = RunView(cfg, run_dir)
    holder = DummyVecEnv(view.eval_factories(0)[:1])
    shares: list[list[list[float]]] = []
    moved: list[list[float] | None] = [None]
    n_states: list[list[int]] = []
    previous: torch.Tensor | None = None
    try:
        for i in range(finished):
            model, rms = load_task_model(view, i, holder, "cpu")
            net = actor_network(model.policy)
            n_experts = net.experts.weights[0].shape[0]
            vec = expert_vectors(net)
            if previous is not None:
                moved.append(movement(previous, vec).tolist())
            previous = vec
            row, counts = [], []
            for j in range(len(view.tasks)):
                states = visited_states(model, view.eval_factories(j), rms, max_steps)
                with torch.no_grad():
                    row.append(routed_shares(net(states), n_experts).tolist())
                counts.append(int(states.shape[0]))
            shares.append(row)
            n_states.append(counts)
    finally:
        holder.close()
    return {
        "tasks": [t.name for t in view.tasks], "checkpoints": list(range(finished)), "n_experts": n_experts,
        "shares": shares, "states": n_states, "movement": moved, "max_steps": max_steps,
        "scored_by": {**code_version(), "version": __version__, "tool": "python -m rl_moe.experts"},
    }  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(prog="python -m rl_moe.experts", description="Which experts each task's checkpoint routes each task to, and how far each task moves each expert.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by python -m rl_moe.crl")
    p.add_argument("--steps", type=int, default=None, help="at most N steps of each episode (default: whole episodes)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    return p


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit code (0 ok, 2 usage error)."""
    args = build_parser().parse_args(argv)
    try:
        for name in ("steps", "threads"):
            if getattr(args, name) is not None and getattr(args, name) < 1:
                raise UsageError(f"--{name} must be >= 1, got {getattr(args, name)}")
        run_dir = Path(args.run_dir)
        if not run_dir.is_dir():
            raise UsageError(f"no such run folder {args.run_dir!r}")
        torch.set_num_threads(args.threads)
        out = usage(run_dir, args.steps)
    except UsageError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_USAGE
    write_json_atomic(run_dir / EXPERTS_FILE, out)
    print(f"{run_dir / EXPERTS_FILE}: routed shares of {out['n_experts']} experts, {len(out['checkpoints'])} checkpoints x {len(out['tasks'])} tasks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
