"""``python -m rl_moe.positions``: score a run's task checkpoints on many held-out positions.

Example::

    python -m rl_moe.positions runs/cw10-paper/ppo-topk-crl-s3 --heldout 25

Under MetaWorld's ``fixed`` positions a run's success rests on the few positions its eval envs
drew (``eval.n_envs``, 5 by default): one position more or less moves a seed's score by 0.2. This
scores each finished task's checkpoint on its own task, on the training envs' positions and on
``--heldout`` held-out positions (the run's own held-out envs first, then new ones from the seeds
that follow), and the last checkpoint on every task it has seen, on the backend the run evaluated
on (``vec_env``: a native pool where it serves the task, else the official envs). With fixed
positions and the deterministic policy an episode per position says all there is (``--episodes``
is per position).
The result goes to ``RUN_DIR/positions-<N>.json``; nothing of the run is modified.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
from stable_baselines3.common.vec_env import DummyVecEnv

from rl_moe import __version__
from rl_moe.atomic import write_json_atomic
from rl_moe.provenance import code_version
from rl_moe.cli import EXIT_USAGE, UsageParser
from rl_moe.continual.evaluation import EvalResult, evaluate
from rl_moe.continual.run_view import RunView
from rl_moe.errors import UsageError
from rl_moe.run_reader import load_task_model, read_run
from rl_moe.rundir import RunDir

#: Held-out positions per task by default: the count the docs' held-out columns are scored at.
DEFAULT_HELDOUT = 25


def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(prog="python -m rl_moe.positions", description="Score a run's task checkpoints on many held-out positions.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by python -m rl_moe.crl")
    p.add_argument("--heldout", type=int, default=DEFAULT_HELDOUT, help=f"held-out positions per task (default {DEFAULT_HELDOUT}; the run's own come first)")
    p.add_argument("--episodes", type=int, default=1, help="episodes per position (default 1: fixed positions, deterministic policy)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    return p


def output_path(run_dir: Path, heldout: int) -> Path:
    return RunDir(run_dir).positions(heldout)


def check_args(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """Validate before any work; :class:`UsageError` names the bad value."""
    for name in ("heldout", "episodes", "threads"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if not Path(args.run_dir).is_dir():
        raise UsageError(f"no such run folder {args.run_dir!r}")
    cfg, results = read_run(Path(args.run_dir))
    if int(results.get("finished_tasks", 0)) < 1:
        raise UsageError(f"run {args.run_dir!r} has no finished task (no checkpoint to score)")
    return cfg, results


def score(run_dir: Path, cfg: Any, results: dict[str, Any], heldout: int, episodes: int) -> dict[str, Any]:
    """Own-task success on the training and held-out positions after each finished task, and the
    last checkpoint's held-out success on every task up to it."""
    sched = RunView(cfg, run_dir)
    finished = int(results["finished_tasks"])
    env = DummyVecEnv(sched.eval_factories(0)[:1])
    own_train: list[EvalResult] = []
    own_heldout: list[EvalResult] = []
    last_row: list[EvalResult] = []
    try:
        for i in range(finished):
            model, rms = load_task_model(sched, i, env, "cpu")

            def on(j: int, is_heldout: bool, n: int) -> EvalResult:
                # on the run's backend, as its own evaluations were (a native pool where it serves the task)
                return evaluate(model, sched.eval_factories(j, is_heldout, n), n * episodes, rms, cfg.vec_env)  # noqa: B023

            own_train.append(on(i, False, cfg.eval.n_envs))
            own_heldout.append(on(i, True, heldout))
            if i == finished - 1:
                last_row = [own_heldout[-1] if j == i else on(j, True, heldout) for j in range(finished)]
    finally:
        env.close()
    names = [t.name for t in sched.tasks[:finished]]
    return {
        "tasks": names, "vec_env": cfg.vec_env, "heldout_positions": heldout, "train_positions": cfg.eval.n_envs, "episodes_per_position": episodes,
        "own_success_train": [r.success for r in own_train], "own_success_heldout": [r.success for r in own_heldout],
        "own_return_train": [r.mean_return for r in own_train], "own_return_heldout": [r.mean_return for r in own_heldout],
        "last_checkpoint_heldout": [r.success for r in last_row],
    }  # fmt: skip


def scored_by() -> dict[str, Any]:
    """The code that scored the positions (the run's own commit is in its config.json): the
    checkout's commit and dirty flag, the package version and the command."""
    return {**code_version(), "version": __version__, "tool": "python -m rl_moe.positions"}


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit code (0 ok, 2 usage error)."""
    args = build_parser().parse_args(argv)
    try:
        cfg, results = check_args(args)
    except UsageError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_USAGE
    torch.set_num_threads(args.threads)
    run_dir = Path(args.run_dir)
    out = {**score(run_dir, cfg, results, args.heldout, args.episodes), "scored_by": scored_by()}
    write_json_atomic(output_path(run_dir, args.heldout), out)
    print(f"{run_dir}: own-task success, {out['train_positions']} training positions / {args.heldout} held-out positions")
    for name, tr, ho in zip(out["tasks"], out["own_success_train"], out["own_success_heldout"]):
        print(f"  {name:<24} {tr:.2f} / {ho:.2f}")
    print("  last checkpoint, held out: " + " ".join(f"{v:.2f}" for v in out["last_checkpoint_heldout"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
