"""The held-out probe batch (SPHERE §5.1, footnote 1) and the plasticity-probe callback wiring.

The paper probes with states from a task outside the sequence so that the diagnostics measure
plasticity on *new* experience. We roll out a uniform-random policy on the suite's probe task
(no pretrained policy ships with the package), keep every ``stride``-th state, and reuse the same
batch at every checkpoint; it is saved as ``probe_states.pt`` (a float32 tensor (N, obs_dim)).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from stable_baselines3.common.callbacks import BaseCallback

from rl_moe.continual.envs import EnvFactory


def collect_probe_states(factory: EnvFactory, n_states: int, stride: int = 5, seed: int = 0) -> torch.Tensor:
    """``n_states`` observations (N, obs_dim) from random-policy rollouts of the probe task.

    :param factory: probe-task env factory
    :param n_states: batch size N
    :param stride: keep one state every ``stride`` steps (less temporal correlation)
    :param seed: action-sampling seed
    """
    env = factory()
    env.action_space.seed(seed)
    states: list[np.ndarray] = []
    try:
        obs, _ = env.reset()
        t = 0
        while len(states) < n_states:
            if t % stride == 0:
                states.append(np.asarray(obs, dtype=np.float32).reshape(-1))
            obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
            t += 1
            if terminated or truncated:
                obs, _ = env.reset()
    finally:
        env.close()
    return torch.from_numpy(np.stack(states))  # (N, obs_dim)


def load_or_collect(path: Path, factory: EnvFactory, n_states: int, seed: int) -> torch.Tensor:
    """The run's probe batch: loaded when ``path`` exists (resume), else collected and saved."""
    if path.is_file():
        return torch.load(path, map_location="cpu", weights_only=True)
    states = collect_probe_states(factory, n_states, seed=seed)
    torch.save(states, path)
    return states


def make_probe_callback(states: torch.Tensor, every: int, seed: int = 0) -> BaseCallback | None:
    """``rl_moe.diagnostics.PlasticityProbe`` on ``states`` every ``every`` env steps, or None when
    the diagnostics package is not importable (the run then trains without ``plasticity/*``).

    The run folder's ``probe_states.pt`` is written by :func:`load_or_collect`, so the probe gets
    the batch in memory only (``run_dir=None``).
    """
    try:
        from rl_moe.diagnostics import PlasticityProbe, ProbeConfig
    except ImportError:
        return None
    every = max(1, int(every))
    # Spectral metrics cost more: every ~100k steps, on the probe's own x positions.
    spectral = every * max(1, round(100_000 / every))
    config = ProbeConfig(probe_every=every, n_states=int(states.shape[0]), spectral_every=spectral, seed=seed)
    return PlasticityProbe(run_dir=None, states=states, config=config)
