"""The held-out probe batch (SPHERE §5.1, footnote 1) and the plasticity-probe callback wiring.

The paper probes with states "from rollouts of a pre-trained policy" on a task outside the
sequence, so that the diagnostics measure plasticity on *new* experience. No trained policy ships
with the package, so the rollouts come from one of :data:`PROBE_POLICIES`: ``expert``, the env
family's scripted policy for each probe task (MetaWorld's ``metaworld.policies``) with Gaussian
action noise, which visits the states a competent policy sees; or ``random``, uniform-random
actions (the only choice for families without scripted experts).

A suite names several probe tasks (CW10: eight MetaWorld tasks outside the sequence), which share
the batch equally: one task's states vary in too few dimensions to tell a fresh network from a
trained one (docs/metrics.md, "The held-out batch"). The rollouts themselves are
:func:`rl_moe.diagnostics.probe.collect_states`; every ``stride``-th state is kept (episode resets
included), and the same batch is reused at every checkpoint; it is saved as ``probe_states.pt`` (a
float32 tensor (N, obs_dim)) through :func:`rl_moe.diagnostics.probe.load_or_create_states`.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rl_moe.diagnostics.probe import Actor, PlasticityProbe, ProbeConfig, collect_states, load_or_create_states
from rl_moe.envs.factories import EnvFactory
from rl_moe.envs.families import FAMILIES
from rl_moe.envs.suite_spec import Suite


def _random_actor(env: gym.Env, factory: EnvFactory, seed: int, noise: float) -> Actor | None:
    return None  # collect_states' own uniform actions, seeded by its seed


def _expert_actor(env: gym.Env, factory: EnvFactory, seed: int, noise: float) -> Actor:
    make_expert = FAMILIES[factory.family].expert
    if make_expert is None:
        with_experts = [f.name for f in FAMILIES.values() if f.expert is not None]
        raise ValueError(f"probe.policy 'expert' needs scripted experts ({', '.join(with_experts)}); family {factory.family!r} has none")
    expert = make_expert(factory.task.name)
    rng = np.random.default_rng(seed)
    box: Any = env.action_space
    low, high = box.low, box.high

    def act(obs: np.ndarray) -> np.ndarray:
        with warnings.catch_warnings():  # metaworld warns that its own gain constants saturate
            warnings.simplefilter("ignore", UserWarning)
            action = np.asarray(expert.get_action(obs), dtype=np.float64)
        # Noise stands in for a trained policy's stochasticity and widens the state coverage.
        return np.clip(action + noise * rng.standard_normal(action.shape), low, high).astype(np.float32)

    return act


#: Rollout policies for the held-out batch: name -> (env, factory, seed, noise) -> actor
#: (None: uniformly random actions).
PROBE_POLICIES: dict[str, Callable[[gym.Env, EnvFactory, int, float], Actor | None]] = {
    "expert": _expert_actor,
    "random": _random_actor,
}


def default_probe_policy(family: str) -> str:
    """``expert`` where scripted experts exist, else ``random`` (what ``probe.policy=auto`` means)."""
    return "random" if FAMILIES[family].expert is None else "expert"


def probe_factories(suite: Suite, seed: int) -> list[EnvFactory]:
    """One env factory per probe task of ``suite``, seeded ``seed``, ``seed + 100``, ..."""
    return [EnvFactory(suite.family, task, suite.episode_length, suite.success_type, seed + 100 * i, suite.family_module) for i, task in enumerate(suite.probe_tasks)]


def collect_probe_states(
    factories: Sequence[EnvFactory], n_states: int, stride: int = 20, seed: int = 0, policy: str = "random", noise: float = 0.3
) -> torch.Tensor:
    """``n_states`` observations (N, obs_dim) from rollouts of the held-out probe tasks, in equal
    shares (the first tasks take one more when N does not divide), task by task.

    :param factories: one env factory per probe task (its seed seeds the env; ``seed`` the actions)
    :param n_states: batch size N
    :param stride: keep one state every ``stride`` steps: less temporal correlation, more episodes
        (and so goals and reset states) per task
    :param seed: action-sampling seed
    :param policy: a key of :data:`PROBE_POLICIES`
    :param noise: std of the Gaussian noise added to ``expert`` actions
    """
    if policy not in PROBE_POLICIES:
        raise ValueError(f"unknown probe policy {policy!r}; valid choices: {', '.join(PROBE_POLICIES)}")
    if not factories:
        raise ValueError("collect_probe_states needs at least one probe task")
    shares = [n_states // len(factories) + (i < n_states % len(factories)) for i in range(len(factories))]
    parts = []
    for factory, share in zip(factories, shares):
        if share == 0:
            continue
        env = factory()
        try:
            actor = PROBE_POLICIES[policy](env, factory, seed, noise)
            # The factory seeded the env at construction (MetaWorld ignores reset(seed=)).
            parts.append(collect_states(env, share, seed=seed, actor=actor, stride=stride, seed_reset=False))
        finally:
            env.close()
    return torch.cat(parts)  # (N, obs_dim)


def load_or_collect(
    path: Path, factories: Sequence[EnvFactory], n_states: int, seed: int, policy: str = "random", noise: float = 0.3, stride: int = 20
) -> torch.Tensor:
    """The run's probe batch: loaded when ``path`` exists (resume), else collected and saved."""
    return load_or_create_states(path, lambda: collect_probe_states(factories, n_states, stride=stride, seed=seed, policy=policy, noise=noise))


def make_probe_callback(states: torch.Tensor, every: int, seed: int = 0, config: ProbeConfig = ProbeConfig()) -> PlasticityProbe:
    """A :class:`~rl_moe.diagnostics.PlasticityProbe` on ``states`` every ``every`` env steps.

    ``config.spectral_every`` is rounded to a multiple of ``every`` (at least one), so the spectral
    metrics share the core metrics' x positions. The run folder's ``probe_states.pt`` is written
    by :func:`load_or_collect`, so the probe gets the batch in memory only (``run_dir=None``).

    :param every: the resolved probe interval (``config.every``, or the evaluation interval when 0)
    :param config: the run's ``probe`` section
    """
    every = max(1, int(every))
    spectral = every * max(1, round(config.spectral_every / every)) if config.spectral_every else 0
    config = dataclasses.replace(config, every=every, n_states=int(states.shape[0]), spectral_every=spectral)
    return PlasticityProbe(run_dir=None, states=states, config=config, seed=seed)
