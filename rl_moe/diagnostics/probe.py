"""``PlasticityProbe``: an SB3 callback logging the diagnostics on a fixed held-out state batch.

The batch is saved as ``probe_states.pt`` (a float tensor (N, obs_dim)) in the run folder and
reloaded when present, so every checkpoint and method of a study is probed on the same states.
The probe runs at the end of a rollout once ``every`` env steps have passed (for PPO the
rollout buffer then holds advantages, used by ``plasticity/grad_norm``), records the scalars with
``self.logger.record`` and dumps them at x = ``num_timesteps``. Expensive families have their own
intervals (0 disables them). Dense policies (SB3 ``MlpPolicy``) get the plasticity metrics only.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3.common.buffers import BaseBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from torch import Tensor

from rl_moe.diagnostics.action_box import mean_outside_box
from rl_moe.diagnostics.actor_grad import actor_grad, learner_family
from rl_moe.diagnostics.groups import (
    coupling_group,
    entk_rank,
    plasticity_group,
    routing_group,
    slq_group,
    spectral_group,
)
from rl_moe.diagnostics.slq import PROBE_SLQ_PROBES, SlqConfig
from rl_moe.diagnostics.views import actor_view, critic_view
from rl_moe.rundir import PROBE_FILE
from rl_moe.tblog import dump_keys

#: obs -> action
Actor = Callable[[np.ndarray], np.ndarray]
T = TypeVar("T")


@dataclass(frozen=True)
class ProbeConfig:
    """The plasticity probe's settings: on what states and when it runs (``--set probe.<field>``
    in a continual run, the ``probe`` section of ``config.json``).

    :param enabled: a continual run attaches the probe (False: no ``plasticity/*`` tags)
    :param n_states: held-out batch size N (also the rollout sample size for the online probe)
    :param every: env steps between probes of the core plasticity and routing metrics; 0 = at
        every periodic evaluation of a continual run (a bare :class:`PlasticityProbe` needs >= 1)
    :param policy: who acts in a continual run's held-out rollouts: ``expert`` (the family's
        scripted policy plus noise), ``random``, or ``auto`` (expert where the family has one;
        stored resolved)
    :param noise: std of the Gaussian noise on expert actions
    :param stride: a continual run keeps one held-out state every ``stride`` env steps
    :param spectral_every: env steps between SD-MoE / MSO / DSC / SSMoE metrics (0 = off); a
        continual run rounds it to a multiple of the probe interval, keeping the same x positions
    :param slq_every: env steps between SLQ estimates of r_e(K) (0 = off; seconds per call)
    :param coupling_every: env steps between gate-expert Gauss-Newton coupling (0 = off)
    :param critic: also log the critic eNTK rank (``plasticity/critic_entk_rank``)
    :param online: also probe N states from the latest rollout / replay data (``_online`` tags,
        SPHERE Fig. 9's robustness check; about as cheap as the held-out probe)
    :param knn: neighbours for ``routing/knn_jaccard``
    :param slq: SLQ probes and Lanczos steps (64 probes: see :class:`~rl_moe.diagnostics.slq.SlqConfig`
        for the measured error)
    """

    enabled: bool = True
    n_states: int = 256
    every: int = 0
    policy: str = "auto"
    noise: float = 0.3
    stride: int = 20
    spectral_every: int = 50_000
    slq_every: int = 0
    coupling_every: int = 0
    critic: bool = True
    online: bool = True
    knn: int = 10
    slq: SlqConfig = field(default_factory=lambda: SlqConfig(n_probes=PROBE_SLQ_PROBES))

    def __post_init__(self) -> None:
        at_least_one = {"n_states": self.n_states, "knn": self.knn, "stride": self.stride}
        non_negative = {"every": self.every, "noise": self.noise, "spectral_every": self.spectral_every,
                        "slq_every": self.slq_every, "coupling_every": self.coupling_every}  # fmt: skip
        for bound, values in ((1, at_least_one), (0, non_negative)):
            for name, value in values.items():
                if value < bound:
                    raise ValueError(f"probe.{name} must be >= {bound}, got {value}")


def load_or_create_states(path: Path, make: Callable[[], Tensor]) -> Tensor:
    """Reload the probe batch from ``path`` or build it with ``make()`` and save it there."""
    if path.exists():
        return torch.load(path, map_location="cpu", weights_only=True)
    states = make().detach().to("cpu", torch.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(states, path)
    return states


def collect_states(
    env: gym.Env, n_states: int, seed: int = 0, actor: Actor | None = None, stride: int = 1, seed_reset: bool = True
) -> Tensor:
    """``n_states`` observations (N, obs_dim) from rollouts in a gymnasium env (e.g. a held-out task).

    :param env: a gymnasium ``Env`` (not vectorized)
    :param seed: seeds the random actions and, with ``seed_reset``, the first ``reset``
    :param actor: obs -> action (e.g. a scripted expert, seeded by its builder); None = uniformly
        random actions from ``env.action_space``
    :param stride: keep one state every ``stride`` steps (less temporal correlation)
    :param seed_reset: ``reset(seed=seed)`` first; False keeps the env's own seeding (MetaWorld
        takes its seed at construction and ignores ``reset(seed=)``)
    """
    obs, _ = env.reset(seed=seed) if seed_reset else env.reset()
    if actor is None:
        env.action_space.seed(seed)
        actor = lambda _obs: env.action_space.sample()  # noqa: E731
    rows: list[np.ndarray] = []
    t = 0
    while len(rows) < n_states:
        if t % stride == 0:
            rows.append(np.asarray(obs, dtype=np.float32).reshape(-1))
        obs, _, terminated, truncated, _ = env.step(actor(obs))
        t += 1
        if terminated or truncated:
            obs, _ = env.reset()
    return torch.as_tensor(np.stack(rows))  # (N, obs_dim)


def _buffer_states(model, n_states: int, gen: torch.Generator) -> Tensor | None:
    """N observations from the latest rollout (PPO) or the most recent replay data (TD3)."""
    if isinstance(model, OnPolicyAlgorithm):
        buf: BaseBuffer | None = model.rollout_buffer
        flattened = model.rollout_buffer.generator_ready  # (steps * envs, ...) once sampled
    else:
        buf, flattened = model.replay_buffer, False
    if buf is None or isinstance(buf.observations, dict):  # dict observations are not supported
        return None
    if not buf.full and buf.pos == 0:
        return None
    filled = buf.buffer_size if buf.full else buf.pos
    obs = buf.observations if flattened else buf.observations[:filled]
    flat = obs.reshape(-1, *model.observation_space.shape)
    if learner_family(model) == "off_policy":
        flat = flat[-n_states:]
    idx = torch.randperm(flat.shape[0], generator=gen)[:n_states].numpy()
    return torch.as_tensor(np.asarray(flat[idx], dtype=np.float32))


class PlasticityProbe(BaseCallback):
    """Logs ``plasticity/``, ``routing/`` and ``spectral/`` diagnostics during ``learn``.

    :param run_dir: folder holding ``probe_states.pt`` (created if missing); None keeps the batch
        in memory only
    :param states: explicit probe states (N, obs_dim), e.g. from :func:`collect_states` on a
        held-out task; saved to ``run_dir`` when that file does not exist yet. Without either, the
        first rollout's observations become the probe batch.
    :param config: :class:`ProbeConfig`; its ``every`` must be >= 1 here (e.g. 10 000)
    :param seed: seed of the state sampling and of the gradient-norm minibatch
    """

    def __init__(
        self, run_dir: str | Path | None = None, states: Tensor | None = None, *, config: ProbeConfig, seed: int = 0, verbose: int = 0
    ) -> None:
        super().__init__(verbose)
        if config.every < 1:
            raise ValueError(f"PlasticityProbe needs probe.every >= 1 env steps, got {config.every} (0 means 'at every periodic evaluation', which only a continual run resolves)")
        self.seed = seed
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.config = config
        self._given = states
        self.states: Tensor | None = None
        self._last: dict[str, int] = {}
        self.seconds = 0.0  # wall time spent probing, for cost accounting
        self.last_values: dict[str, float] = {}
        self._failed: set[str] = set()  # metric families that failed once (warned)

    def _on_training_start(self) -> None:
        path = self.run_dir / PROBE_FILE if self.run_dir is not None else None
        if path is not None and path.exists():
            self.states = load_or_create_states(path, lambda: self._given)
        elif self._given is not None:
            self.states = self._given.detach().to("cpu", torch.float32)
            if path is not None:
                load_or_create_states(path, lambda: self.states)
        # Steps are counted from the last probe, so a resumed learn() continues the schedule.
        for key in ("core", "spectral", "slq", "coupling"):
            self._last.setdefault(key, -(10**18))

    def _on_step(self) -> bool:
        return True

    def state(self) -> dict[str, Any]:
        """The schedule and cost an in-task checkpoint keeps (the step of each family's last probe)."""
        return {"last": dict(self._last), "seconds": self.seconds}

    def resume(self, state: dict[str, Any]) -> None:
        """Continue the schedule of :meth:`state` (set before training starts)."""
        self._last.update({str(k): int(v) for k, v in state["last"].items()})
        self.seconds = float(state["seconds"])

    def _due(self, key: str, every: int) -> bool:
        return every > 0 and self.num_timesteps - self._last[key] >= every

    def _on_rollout_end(self) -> None:
        if self._due("core", self.config.every):
            self.probe()

    def _ensure_states(self) -> Tensor | None:
        if self.states is None:
            gen = torch.Generator().manual_seed(self.seed)
            found = _buffer_states(self.model, self.config.n_states, gen)
            if found is None:
                return None
            self.states = found
            if self.run_dir is not None:
                self.states = load_or_create_states(self.run_dir / PROBE_FILE, lambda: found)
        return self.states

    def _family(self, name: str, fn: Callable[[], T], failed: T) -> T:
        """``fn()``, or ``failed`` when it raises: one metric family failing (e.g. an ``eigh`` that
        does not converge, or SSMoE metrics with alpha = 1) must not drop the others. Warns once per family."""
        try:
            return fn()
        except (RuntimeError, ValueError) as exc:
            if name not in self._failed:
                self._failed.add(name)
                warnings.warn(f"plasticity probe: the {name} metrics failed at step {self.num_timesteps} ({type(exc).__name__}: {exc}); they are left out when they fail (warned once)", RuntimeWarning, stacklevel=3)
            return failed

    def compute(self) -> dict[str, float]:
        """All due metrics at the current step, as ``{tag: value}`` (updates the schedule)."""
        cfg, policy = self.config, self.model.policy
        states = self._ensure_states()
        if states is None:
            return {}
        obs = states[: cfg.n_states].to(policy.device)
        view = actor_view(policy)
        values = self._family("plasticity", lambda: plasticity_group(view, obs), {})
        values.update(self._family("routing", lambda: routing_group(view, obs, cfg.knn), {}))
        grad = self._family("grad_norm", lambda: actor_grad(self.model, view, obs, cfg.n_states, self.seed), None)
        if grad is not None:
            values["plasticity/grad_norm"] = grad.norm
        outside = self._family("policy", lambda: mean_outside_box(policy, obs, self.model.action_space), None)
        if outside is not None:
            values["policy/mean_outside_box"] = outside
        critic = critic_view(policy) if cfg.critic else None
        if critic is not None:
            values.update(self._family("critic", lambda: {"plasticity/critic_entk_rank": entk_rank(critic, obs)}, {}))
        if cfg.online:
            online = _buffer_states(self.model, cfg.n_states, torch.Generator().manual_seed(self.seed + self.num_timesteps))
            if online is not None:
                online = online.to(policy.device)
                values.update(self._family("plasticity_online", lambda: plasticity_group(view, online, suffix="_online"), {}))
                values.update(self._family("routing_online", lambda: routing_group(view, online, cfg.knn, suffix="_online"), {}))
                outside = self._family("policy_online", lambda: mean_outside_box(policy, online, self.model.action_space), None)
                if outside is not None:
                    values["policy/mean_outside_box_online"] = outside
        if self._due("spectral", cfg.spectral_every):
            expert_grads = grad.expert_grads if grad is not None else None
            values.update(self._family("spectral", lambda: spectral_group(view, obs, expert_grads), {}))
            self._last["spectral"] = self.num_timesteps
        if self._due("slq", cfg.slq_every):
            values.update(self._family("slq", lambda: slq_group(view, obs, cfg.slq), {}))
            self._last["slq"] = self.num_timesteps
        if self._due("coupling", cfg.coupling_every):
            values.update(self._family("coupling", lambda: coupling_group(view, obs), {}))
            self._last["coupling"] = self.num_timesteps
        self._last["core"] = self.num_timesteps
        return values

    def probe(self) -> dict[str, float]:
        """Compute, record and dump the due metrics; returns the finite values logged."""
        start = time.perf_counter()
        try:
            computed = self.compute()
        except (RuntimeError, ValueError) as exc:  # e.g. an eigh that does not converge
            # A diagnostic must never end a run: warn and try again at the next probe.
            warnings.warn(f"plasticity probe failed at step {self.num_timesteps} ({type(exc).__name__}: {exc}); no plasticity/* this time", RuntimeWarning, stacklevel=2)
            computed = {}
        values = {k: float(v) for k, v in computed.items() if math.isfinite(float(v))}
        for tag, value in values.items():
            self.logger.record(tag, value)
        self.seconds += time.perf_counter() - start
        if values:
            self.logger.record("time/probe_seconds", self.seconds)
            # Only the probe's own tags: an update's pending train/* belong to the learner's dump.
            dump_keys(self.logger, [*values, "time/probe_seconds"], self.num_timesteps)
        self.last_values = values
        return values
