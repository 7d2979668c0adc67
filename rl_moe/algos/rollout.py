"""PPO rollouts through SB3's own ``collect_rollouts``, with one device-to-host copy per env step.

SB3's loop copies the policy's actions, values and log-probabilities to the host at every step
(``RolloutBuffer.add`` calls ``.cpu()`` on the last two), and each copy waits for the device. Two of
SB3's extension points remove the last two copies and, on CUDA, most of the kernel launches, without
a second copy of the loop:

- :class:`DeviceRolloutBuffer`, PPO's ``rollout_buffer_class``: values and log-probabilities stay
  on the device and reach SB3's arrays in one copy each, right before SB3's GAE (Schulman et al.
  2016, arXiv:1506.02438) runs on them unchanged;
- :class:`GraphedActing`: on CUDA, the policy call (features, MoE actor and critic in the static
  layout, action sampling, log-probability) is captured once as a CUDA graph at batch ``n_envs``
  and replayed every step, installed as the policy's ``forward`` while a rollout runs.

On a CPU the buffer is bit-identical to SB3's (tested): the loop is SB3's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.policies import ActorCriticPolicy
from torch import Tensor

from rl_moe.algos.graphs import GraphGuard, capture, replay_mismatch
from rl_moe.algos.learner import PPOLearner


class Acted(NamedTuple):
    """One policy call on the envs' observations."""

    actions: Tensor  # (n_envs, act_dim)
    values: Tensor  # (n_envs, 1)
    log_probs: Tensor  # (n_envs,)


def acting_unsupported_reason(algo: PPOLearner) -> str | None:
    """Why the policy call of this learner's rollouts is not graphed (None when it can be)."""
    if not isinstance(algo.observation_space, spaces.Box):
        return f"observation space {type(algo.observation_space).__name__} (only Box)"
    if not isinstance(algo.action_space, spaces.Box):
        return f"action space {type(algo.action_space).__name__} (only Box)"
    if algo.use_sde:
        return "gSDE exploration"
    return None


class _Unread:
    """Stands in for a device tensor in SB3's ``RolloutBuffer.add``, which reads values and
    log-probabilities as ``x.clone().cpu().numpy()``: zeros, with nothing copied from the device."""

    def __init__(self, n_envs: int) -> None:
        self.shape = (n_envs,)
        self._zeros = np.zeros(n_envs, dtype=np.float32)

    def clone(self) -> _Unread:
        return self

    def cpu(self) -> _Unread:
        return self

    def numpy(self) -> np.ndarray:
        return self._zeros


class DeviceRolloutBuffer(RolloutBuffer):
    """SB3's ``RolloutBuffer`` that keeps each step's values and log-probabilities on the device.

    :meth:`add` hands SB3's own ``add`` placeholders for them (so nothing waits for the device)
    and keeps the real ones in device arrays; :meth:`compute_returns_and_advantage`
    copies them into SB3's arrays first, one copy each. Everything else is SB3's.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Allocated once: a rollout writes rows 0..pos-1 before they are read, so reset need not clear them.
        shape = (self.buffer_size, self.n_envs)
        self.device_values = torch.zeros(shape, device=self.device)  # (T, n_envs)
        self.device_log_probs = torch.zeros(shape, device=self.device)  # (T, n_envs)
        self._placeholder = _Unread(self.n_envs)

    def reset(self) -> None:
        super().reset()
        self._flushed = 0  # rows already copied into SB3's arrays

    def add(self, obs: Any, action: np.ndarray, reward: np.ndarray, episode_start: np.ndarray, value: Tensor, log_prob: Tensor) -> None:
        self.device_values[self.pos].copy_(value.detach().flatten())
        self.device_log_probs[self.pos].copy_(log_prob.detach().reshape(self.n_envs))
        super().add(obs, action, reward, episode_start, self._placeholder, self._placeholder)  # type: ignore[arg-type]

    def flush(self) -> None:
        """Copy the device values and log-probabilities of the steps added so far into SB3's arrays."""
        if self.pos > self._flushed:
            self.values[: self.pos] = self.device_values[: self.pos].cpu().numpy()
            self.log_probs[: self.pos] = self.device_log_probs[: self.pos].cpu().numpy()
            self._flushed = self.pos

    def compute_returns_and_advantage(self, last_values: Tensor, dones: np.ndarray) -> None:
        self.flush()
        super().compute_returns_and_advantage(last_values, dones)


class _CapturedActing:
    """A policy forward at batch ``n_envs`` replayed from a CUDA graph.

    Inputs and outputs are the graph's static tensors: each call overwrites the last call's
    outputs, which SB3's loop has copied away (actions) or the buffer stored (values,
    log-probabilities) by then.
    """

    def __init__(self, forward: Callable[[Tensor], Any], obs: Tensor) -> None:
        self.obs = obs.clone()  # (n_envs, *obs_shape), the graph's input

        def act() -> Acted:
            with torch.no_grad():
                return Acted(*forward(self.obs))

        self.graph, self.out = capture(act, self.obs.device)

    def __call__(self, obs: Tensor) -> Acted:
        self.obs.copy_(obs)  # straight into the graph's input
        self.graph.replay()
        return self.out

    def mismatch(self, policy: ActorCriticPolicy, obs: Tensor) -> float | None:
        """Replay once and compare with the eager policy on the same states: values, and the
        log-probabilities of the replayed (sampled) actions. None when they agree."""
        out = self(obs)
        with torch.no_grad():
            values, log_prob, _ = policy.evaluate_actions(self.obs, out.actions)
        return replay_mismatch([out.values.flatten(), out.log_probs], [values.flatten(), log_prob])


class GraphedActing:
    """The CUDA-graph policy call of one learner's rollouts (eager where no graph can run).

    :param algo: the learner
    :param cuda_graphs: on CUDA, replay the policy call from a CUDA graph (falls back to eager
        calls, with a warning, when the capture fails or its first replay disagrees)
    """

    def __init__(self, algo: PPOLearner, cuda_graphs: bool = True) -> None:
        self.algo = algo
        self.guard = GraphGuard("rollout acting", cuda_graphs and algo.device.type == "cuda")
        self._captured: _CapturedActing | None = None
        self._captured_key: tuple[Any, ...] | None = None

    @property
    def cuda_graphs(self) -> bool:
        """Whether the policy call is replayed from a graph (False after a refused capture or a
        first replay that disagreed)."""
        return self.guard.enabled

    @cuda_graphs.setter
    def cuda_graphs(self, value: bool) -> None:
        self.guard.enabled = value

    @contextmanager
    def installed(self) -> Iterator[None]:
        """The policy's ``forward`` replays the graph inside the ``with`` block (SB3's loop calls
        ``policy(obs)``); the class's own forward is back afterwards."""
        policy = self.algo.policy
        if not self.cuda_graphs:
            yield
            return
        eager = policy.forward

        def forward(obs: Tensor, deterministic: bool = False) -> Any:
            act = None if deterministic else self._acting(eager, obs)
            return eager(obs, deterministic) if act is None else tuple(act(obs))

        policy.forward = forward  # type: ignore[method-assign]
        try:
            yield
        finally:
            del policy.forward  # the instance attribute; the class's forward shows through again

    def _acting(self, eager: Callable[..., Any], obs: Tensor) -> _CapturedActing | None:
        """This rollout's graph (None: act eagerly), captured again when the policy, its parameter
        tensors or the batch change, since a graph reads their storage."""
        policy = self.algo.policy
        key = (id(policy), tuple(obs.shape), tuple(p.data_ptr() for p in policy.parameters()))
        if key != self._captured_key:
            self._captured, self._captured_key = None, key
            captured = self.guard.captured(lambda: _CapturedActing(eager, obs))
            # the graph checks itself on its first replay
            if captured is None or not self.guard.replay_agrees(captured.mismatch(policy, obs)):
                return None
            self._captured = captured
        return self._captured if self.cuda_graphs else None
