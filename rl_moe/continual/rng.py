"""Everything beyond the weights that decides how training continues: the random generators and
SB3's counters, captured at each task boundary so a resumed run continues bit for bit.

Saved beside each checkpoint (:meth:`rl_moe.rundir.RunDir.training_state`). The scheduler restores it at
the start of the next task on *both* paths (uninterrupted and resumed), so whatever ran between
(the end-of-task evaluation, env construction) cannot make the two differ.
"""

from __future__ import annotations

import random
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch
from stable_baselines3.common.base_class import BaseAlgorithm

from rl_moe.continual.state_files import load_torch_state

#: Seed offsets that keep a run's training, evaluation and probe envs on disjoint streams.
SEED_STREAMS: dict[str, int] = {"train": 0, "eval": 50_000, "probe": 99_000}


def env_seed(run_seed: int, stream: str, task_index: int = 0) -> int:
    """The seed of the first env of a run's ``stream`` (a key of :data:`SEED_STREAMS`) on task
    ``task_index``; the envs of a vector env take it and the next ones. Runs 100,000 apart."""
    return run_seed * 100_000 + SEED_STREAMS[stream] + task_index * 100

def capture(model: BaseAlgorithm) -> dict[str, Any]:
    """The generators' states (python, numpy, torch CPU and CUDA, the action space's) and counters."""
    name, keys, pos, has_gauss, cached = np.random.get_state()  # type: ignore[misc]
    state: dict[str, Any] = {
        "python": random.getstate(),
        # As a tensor and plain numbers, so the file loads with torch.load(weights_only=True).
        "numpy": (name, torch.from_numpy(np.asarray(keys, dtype=np.int64)), int(pos), int(has_gauss), float(cached)),
        "torch": torch.get_rng_state(),
        "action_space": model.action_space.np_random.bit_generator.state,
        # SB3 counters that steer training and are not in its .zip parameters: the update count
        # drives TD3's delayed actor updates.
        "counters": {"_n_updates": int(model._n_updates), "_episode_num": int(model._episode_num)},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    # SB3 keeps the last episodes across learn() calls (rollout/ep_* means); a resumed model
    # starts with none, so they are part of how training continues too.
    if model.ep_info_buffer is not None:
        episodes = [[float(e["r"]), float(e["l"]), float(e["t"])] for e in model.ep_info_buffer]
        state["episodes"] = torch.tensor(episodes, dtype=torch.float64).reshape(-1, 3)  # (n, [r, l, t])
        state["successes"] = torch.tensor([bool(x) for x in model.ep_success_buffer], dtype=torch.bool)
    return state


def restore(model: BaseAlgorithm, state: dict[str, Any]) -> None:
    """Put back what :func:`capture` returned."""
    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    model.action_space.np_random.bit_generator.state = state["action_space"]
    counters = state["counters"]
    model._n_updates, model._episode_num = int(counters["_n_updates"]), int(counters["_episode_num"])
    if "episodes" in state:
        window = model._stats_window_size  # private: SB3 2.x's size of these deques
        model.ep_info_buffer = deque(({"r": r, "l": int(n), "t": t} for r, n, t in state["episodes"].tolist()), maxlen=window)
        model.ep_success_buffer = deque((bool(x) for x in state["successes"].tolist()), maxlen=window)


def load(path: Path) -> dict[str, Any] | None:
    """The saved state, or None when the file does not exist (runs from before it existed).

    :raises ValueError: if the file is unreadable
    """
    return load_torch_state(path, "training state", key="numpy")
