"""Score a run's faucet-close checkpoint under evaluation variants: Continual World's 200-step
horizon against MetaWorld's own 500, deterministic against sampled actions (docs/reproduce.md, "Where hammer falls short").

    python -m tools.eval_variants RUN_DIR [--task faucet-close-v3] [--episodes 20]

Needs the run's checkpoints, which results/ does not keep: run it on the run folder itself.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from rl_moe.continual.checkpoints import load_checkpoint
from rl_moe.envs.families import FAMILIES
from rl_moe.envs.suites import TaskSpec


def success_rate(model, task: str, horizon: int, deterministic: bool, episodes: int) -> float:
    """Share of ``episodes`` fresh goals (env seeds 1000, 1001, ...) with ``info["success"]`` at
    any of the first ``horizon`` steps (MetaWorld truncates at 500 itself)."""
    wins = []
    for ep in range(episodes):
        env = FAMILIES["metaworld"].make(TaskSpec(task), 1000 + ep)
        obs, _ = env.reset()
        won = False
        for _ in range(horizon):
            action, _ = model.predict(obs, deterministic=deterministic)
            obs, _, terminated, truncated, info = env.step(action)
            won = won or bool(info.get("success", 0))
            if terminated or truncated:
                break
        wins.append(won)
        env.close()
    return float(np.mean(wins))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run", help="run folder with checkpoints")
    p.add_argument("--task", default="faucet-close-v3")
    p.add_argument("--episodes", type=int, default=20)
    args = p.parse_args()
    torch.set_num_threads(1)
    model = load_checkpoint(args.run, args.task)
    for horizon in (200, 500):
        for det in (True, False):
            rate = success_rate(model, args.task, horizon, det, args.episodes)
            print(f"{horizon} steps, {'deterministic' if det else 'sampled'} actions: {rate:.2f}")


if __name__ == "__main__":
    main()
