"""A finished task's checkpoint scored on the training envs' positions and on held-out ones, with
success at any step and at the last step, and the episodes' final stage terms (docs/results.md, §2).

    python -m tools.eval_positions RUN_DIR [RUN_DIR ...] [--episodes 10] [--out FILE.json]

For runs made before ``eval.positions`` existed (their curves scored held-out positions only).
Under MetaWorld's ``fixed`` positions, the training view is the SPHERE authors' evaluation: eval
envs seeded like training envs 0..k-1 keep exactly those envs' positions. Deterministic actions,
and with ``--actions deterministic sampled`` also actions sampled from the policy (the training
episodes' own rule), to tell a policy that fails only in its mean from one that fails outright.
Needs the run's checkpoints, which results/ does not keep: run it on the run folder itself.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from stable_baselines3.common.vec_env import DummyVecEnv

from rl_moe.continual.checkpoints import load_checkpoint
from rl_moe.continual.config import RunConfig
from rl_moe.continual.run_view import RunView

STAGES = ("near_object", "grasp_success", "in_place_reward", "obj_to_target")


def score(model, factories, episodes: int, deterministic: bool = True) -> dict[str, float]:
    """Episodes split over the envs: success (any step, last step), return, and the
    mean of each stage term at the episodes' last step."""
    venv = DummyVecEnv(list(factories))
    k = venv.num_envs
    quota = np.array([(episodes + i) // k for i in range(k)])
    done = np.zeros(k, dtype=int)
    rows: list[dict[str, float]] = []
    obs = venv.reset()
    while (done < quota).any():
        actions, _ = model.predict(obs, deterministic=deterministic)
        obs, _, dones, infos = venv.step(actions)
        for i in np.flatnonzero(dones):
            if done[i] < quota[i]:
                info = infos[i]
                row = {"success": float(info["is_success"]), "success_last": float(info.get("success_last", info["is_success"])), "return": float(info["episode"]["r"])}
                row.update({k_: float(info[k_]) for k_ in STAGES if k_ in info})
                rows.append(row)
                done[i] += 1
    venv.close()
    return {key: float(np.mean([r[key] for r in rows if key in r])) for key in rows[0]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--actions", nargs="+", choices=("deterministic", "sampled"), default=["deterministic"])
    p.add_argument("--out", default=None, help="write the table as JSON here")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)  # sampled actions: the same draws on every call
    table = {}
    for run in map(Path, args.runs):
        cfg = RunConfig.from_dict(json.loads((run / "config.json").read_text()))
        finished = int(json.loads((run / "results.json").read_text())["finished_tasks"])
        sched = RunView(cfg, run)
        for i in range(finished):
            model = load_checkpoint(run, i)
            views = {
                view + ("" if act == "deterministic" else f" positions, {act} actions"): score(model, sched.eval_factories(i, heldout=view == "heldout"), args.episodes, act == "deterministic")
                for act in args.actions
                for view in ("train", "heldout")
            }
            table["/".join([*run.resolve().parts[-3:], cfg.tasks[i]])] = views  # runs folder/suite/run/task
            for view, v in views.items():
                cells = "  ".join(f"{k} {x:.2f}" for k, x in v.items())
                label = view if view.endswith("actions") else f"{view} positions"
                print(f"{run.parent.name}/{run.name} {cfg.tasks[i]} [{label}] {cells}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(table, indent=1) + "\n")


if __name__ == "__main__":
    main()
