"""``python -m rl_moe.evaluate``: re-evaluate a finished run's task checkpoints with another router,
or render them as videos (``--video``, :mod:`rl_moe.video`).

Example::

    python -m rl_moe.evaluate runs/cw10/ppo-topk-crl-s0-20260101-120000 --router ssmoe --alpha 0.7
    python -m rl_moe.evaluate runs/cw10/ppo-topk-crl-s0-20260101-120000 --video --video-size 320x240

Every stored task checkpoint is loaded, its actor re-routed training-free (``ssmoe``: SSMoE's
eigenvector router mixed with the learned gate, alpha P_EV + (1 - alpha) P_R; ``own``: the
run's own router unchanged, a control that reproduces its matrix) and scored on the same cells, eval envs and seeds as the
run's own success matrix. The result goes to a new file ``reroute-<router>-a<alpha>.json`` in the
run folder, holding both matrices; nothing of the run is modified. Whether the EV router undoes
routing collapse after continual training reads off the two matrices.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from stable_baselines3.common.vec_env import DummyVecEnv
from torch import nn

from rl_moe.atomic import write_json_atomic
from rl_moe.cli import EXIT_USAGE, UsageParser
from rl_moe.continual.evaluation import evaluate
from rl_moe.continual.methods import get_method
from rl_moe.continual.run_view import RunView
from rl_moe.errors import UsageError
from rl_moe.nn import EVRerouted
from rl_moe.policies import MoEActorCriticPolicy, MoETD3Policy
from rl_moe.recording import VideoSettings
from rl_moe.run_reader import load_task_model, read_run
from rl_moe.rundir import RunDir
from rl_moe.video import render_run

#: Actor network kinds whose Top-K router the EV router can stand in for.
REROUTABLE_KINDS: tuple[str, ...] = ("topk", "sdmoe", "ssmoe")


def _ssmoe(net: nn.Module, alpha: float, top_c: int) -> nn.Module:
    return EVRerouted(net, alpha, top_c)


def _own(net: nn.Module, alpha: float, top_c: int) -> nn.Module:
    return net  # the router the run trained with, unchanged: a control


#: --router name -> (trained actor, alpha, top_c) -> re-routed actor: training-free re-routings of a
#: trained Top-K actor (not :data:`rl_moe.nn.routing.ROUTERS`, the routers networks are built with).
REROUTINGS: dict[str, Callable[[nn.Module, float, int], nn.Module]] = {"ssmoe": _ssmoe, "own": _own}


def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(prog="python -m rl_moe.evaluate", description="Re-evaluate a run's task checkpoints with another router (training-free).")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by python -m rl_moe.crl")
    p.add_argument("--router", default="ssmoe", help=f"router to evaluate with: {', '.join(REROUTINGS)}")
    p.add_argument("--alpha", type=float, default=0.7, help="EV-router weight alpha in [0, 1] (SSMoE; default 0.7)")
    p.add_argument("--top-c", type=int, default=2, help="eigenvectors per expert embedding (default 2)")
    p.add_argument("--episodes", type=int, default=None, help="episodes per cell (default: the run's eval.matrix_episodes)")
    p.add_argument("--device", default="cpu", help="torch device: cpu or cuda")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--video", action="store_true", help="render MP4s instead: each task's checkpoint on its task, the last checkpoint on every task (RUN_DIR/videos/)")
    p.add_argument("--video-size", default="320x240", metavar="WxH", help="frame size (default 320x240)")
    p.add_argument("--video-episodes", type=int, default=1, help="episodes per checkpoint and task, each on the next eval position (default 1)")
    p.add_argument("--video-stride", type=int, default=2, help="keep every Nth step's frame (default 2)")
    p.add_argument("--video-steps", type=int, default=None, help="stop each episode after N steps (default: the suite's episode length)")
    p.add_argument("--camera", default="corner", help="MuJoCo camera (MetaWorld: corner, corner2, corner3, topview, behindGripper, gripperPOV)")
    return p


def output_path(run_dir: Path, router: str, alpha: float) -> Path:
    """``RUN_DIR/reroute-<router>-a<alpha>.json``."""

    return RunDir(run_dir).reroute(router, alpha)


def check_args(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """Validate everything before any work; :class:`UsageError` names the bad value."""

    if args.router not in REROUTINGS:
        raise UsageError(f"unknown router {args.router!r}; valid choices: {', '.join(REROUTINGS)}")
    if not 0.0 <= args.alpha <= 1.0:
        raise UsageError(f"--alpha must be in [0, 1], got {args.alpha}")
    if args.top_c < 1:
        raise UsageError(f"--top-c must be >= 1, got {args.top_c}")
    if args.episodes is not None and args.episodes < 1:
        raise UsageError(f"--episodes must be >= 1, got {args.episodes}")
    if args.threads < 1:
        raise UsageError(f"--threads must be >= 1, got {args.threads}")
    if args.device not in ("cpu", "cuda"):
        raise UsageError(f"unknown device {args.device!r}; valid choices: cpu, cuda")
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"no such run folder {args.run_dir!r}")
    cfg, results = read_run(run_dir)
    kind = get_method(cfg.method).kind
    if not cfg.net.actor_moe or kind not in REROUTABLE_KINDS:
        raise UsageError(f"run {str(run_dir)!r} has a {kind!r} actor; --router needs a Top-K routed actor: {', '.join(REROUTABLE_KINDS)}")
    if int(results.get("finished_tasks", 0)) < 1:
        raise UsageError(f"run {str(run_dir)!r} has no finished task (no checkpoint to evaluate)")
    return cfg, results


def reroute_actor(policy: nn.Module, router: str, alpha: float, top_c: int) -> None:
    """Replace the policy's actor network by its re-routed version (same parameters)."""
    if not isinstance(policy, (MoEActorCriticPolicy, MoETD3Policy)):
        raise UsageError(f"cannot find the actor network of {type(policy).__name__}; valid choices: MoEActorCriticPolicy, MoETD3Policy")
    policy.replace_actor_network(lambda net: REROUTINGS[router](net, alpha, top_c))


def reevaluate(run_dir: Path, cfg: Any, results: dict[str, Any], router: str, alpha: float, top_c: int, episodes: int, device: str) -> list[list[float | None]]:
    """The success matrix of the re-routed checkpoints, on the cells the run's matrix filled."""

    sched = RunView(cfg, run_dir)
    original = results["success_matrix"]
    env = DummyVecEnv(sched.eval_factories(0)[:1])
    matrix: list[list[float | None]] = [[None] * len(sched.tasks) for _ in sched.tasks]
    try:
        for i in range(int(results["finished_tasks"])):
            model, rms = load_task_model(sched, i, env, device)
            reroute_actor(model.policy, router, alpha, top_c)
            for j, cell in enumerate(original[i]):
                if cell is not None:
                    matrix[i][j] = evaluate(model, sched.eval_factories(j), episodes, rms, cfg.vec_env).success
    finally:
        env.close()
    return matrix


def video_settings(args: argparse.Namespace) -> VideoSettings:
    """The ``--video-*`` options; :class:`UsageError` names a bad one."""
    m = re.fullmatch(r"(\d+)x(\d+)", args.video_size)
    if m is None:
        raise UsageError(f"--video-size {args.video_size!r} is not WIDTHxHEIGHT, e.g. 320x240")
    settings = VideoSettings(int(m[1]), int(m[2]), args.video_episodes, args.video_stride, args.video_steps, args.camera)
    settings.check()
    return settings


def _videos(args: argparse.Namespace) -> int:
    try:
        settings = video_settings(args)
        run_dir = Path(args.run_dir)
        if not run_dir.is_dir():
            raise UsageError(f"no such run folder {args.run_dir!r}")
        torch.set_num_threads(args.threads)
        written = render_run(run_dir, settings, args.device)
    except UsageError as exc:  # MissingDependencyError is one
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_USAGE
    print(f"{len(written)} videos in {Path(args.run_dir) / 'videos'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit code (0 ok, 2 usage error)."""
    args = build_parser().parse_args(argv)
    if args.video:
        return _videos(args)
    try:
        cfg, results = check_args(args)
        if args.device == "cuda":
            if not torch.cuda.is_available():
                raise UsageError("device 'cuda' requested but no CUDA GPU is available; valid choices here: cpu")
    except UsageError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_USAGE

    torch.set_num_threads(args.threads)
    run_dir = Path(args.run_dir)
    episodes = args.episodes or cfg.eval.matrix_episodes
    matrix = reevaluate(run_dir, cfg, results, args.router, args.alpha, args.top_c, episodes, args.device)
    out = output_path(run_dir, args.router, args.alpha)

    write_json_atomic(out, {
        "router": args.router, "alpha": args.alpha, "top_c": args.top_c, "episodes": episodes,
        "tasks": list(cfg.tasks), "success_matrix": matrix, "original_success_matrix": results["success_matrix"],
    })  # fmt: skip
    print(f"re-routed ({args.router}, alpha={args.alpha:g}) success matrix: {out}")
    for i, row in enumerate(matrix):
        cells = " ".join("  -  " if v is None else f"{v:5.2f}" for v in row)
        was = " ".join("  -  " if v is None else f"{v:5.2f}" for v in results["success_matrix"][i])
        print(f"  after task {i}: {cells}   (original: {was})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
