"""PPO rollout collection with one device-to-host copy per env step: the actions.

SB3's ``collect_rollouts`` copies the policy's actions, values and log-probabilities to the host at
every step (``RolloutBuffer.add`` calls ``.cpu()`` on each), and each copy waits for the device.
Here values and log-probabilities stay on the device in per-rollout arrays and reach the buffer in
one copy when the rollout ends, before SB3's GAE (Schulman et al. 2016, arXiv:1506.02438) runs on
it unchanged. On CUDA the policy call itself (features, MoE actor and critic in the static layout,
action sampling, log-probability) is captured once as a CUDA graph at batch ``n_envs`` and replayed
every step, so acting costs one launch instead of a few hundred.

The loop is SB3 2.x's ``OnPolicyAlgorithm.collect_rollouts`` for Box observation and action spaces
without gSDE (the sync-free update's domain, :func:`rl_moe.algos.fast.unsupported_reason`), in the
same order of random draws, so on a CPU the buffer is bit-identical to SB3's (tested).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.utils import obs_as_tensor
from stable_baselines3.common.vec_env import VecEnv
from torch import Tensor

from rl_moe.algos.graphs import capture, capture_failed, replay_failed, replay_mismatch
from rl_moe.algos.learner import PPOLearner


class Acted(NamedTuple):
    """One policy call on the envs' observations."""

    actions: Tensor  # (n_envs, act_dim)
    values: Tensor  # (n_envs, 1)
    log_probs: Tensor  # (n_envs,)


def unsupported_reason(algo: PPOLearner) -> str | None:
    """Why this collector cannot run the learner's rollouts (None when it can)."""
    if not isinstance(algo.observation_space, spaces.Box):
        return f"observation space {type(algo.observation_space).__name__} (only Box)"
    if not isinstance(algo.action_space, spaces.Box):
        return f"action space {type(algo.action_space).__name__} (only Box)"
    if algo.use_sde:
        return "gSDE exploration"
    return None


class _CapturedActing:
    """The policy's forward at batch ``n_envs`` replayed from a CUDA graph.

    Inputs and outputs are the graph's static tensors: each call overwrites the last call's
    outputs, which the collector has copied away by then.
    """

    def __init__(self, policy: torch.nn.Module, obs: Tensor) -> None:
        self.obs = obs.clone()  # (n_envs, *obs_shape), the graph's input

        def act() -> Acted:
            with torch.no_grad():
                return Acted(*policy(self.obs))

        self.graph, self.out = capture(act, self.obs.device)

    def __call__(self, obs: np.ndarray) -> Acted:
        self.obs.copy_(torch.from_numpy(obs))  # straight into the graph's input: one host-to-device copy
        self.graph.replay()
        return self.out

    def mismatch(self, policy: torch.nn.Module, obs: np.ndarray) -> float | None:
        """Replay once and compare with the eager policy on the same states: values, and the
        log-probabilities of the replayed (sampled) actions. None when they agree."""
        out = self(obs)
        with torch.no_grad():
            values, log_prob, _ = policy.evaluate_actions(self.obs, out.actions)
        return replay_mismatch([out.values.flatten(), out.log_probs], [values.flatten(), log_prob])


class DeviceRolloutCollector:
    """Fills a learner's ``RolloutBuffer`` like SB3's ``collect_rollouts``, reading the device once per step.

    :param algo: the learner (its policy, envs and buffer)
    :param cuda_graphs: on CUDA, replay the policy call from a CUDA graph (falls back to eager
        calls, with a warning, when the capture fails)
    """

    def __init__(self, algo: PPOLearner, cuda_graphs: bool = True) -> None:
        self.algo = algo
        self.device = algo.device
        self.cuda_graphs = cuda_graphs and self.device.type == "cuda"
        buffer = algo.rollout_buffer
        self.values = torch.zeros((buffer.buffer_size, buffer.n_envs), device=self.device)  # (T, n_envs)
        self.log_probs = torch.zeros_like(self.values)  # (T, n_envs)
        self._captured: _CapturedActing | None = None
        self._captured_key: tuple[Any, ...] | None = None

    # --- acting -------------------------------------------------------------------------------

    def _eager(self, obs: np.ndarray) -> Acted:
        with torch.no_grad():
            return Acted(*self.algo.policy(obs_as_tensor(obs, self.device)))

    def _acting(self, obs: np.ndarray) -> Callable[[np.ndarray], Acted]:
        """The policy call of this rollout: a graph replay when one can be (or was) captured."""
        if not self.cuda_graphs:
            return self._eager
        policy = self.algo.policy
        # A graph reads the parameters' storage: a new policy or a replaced tensor needs a new one.
        key = (id(policy), tuple(obs.shape), tuple(p.data_ptr() for p in policy.parameters()))
        if key != self._captured_key:
            self._captured, self._captured_key = None, key
            try:
                self._captured = _CapturedActing(policy, obs_as_tensor(obs, self.device))
            except RuntimeError as exc:  # an op the capture refuses: act eagerly
                capture_failed("rollout acting", exc)
                self.cuda_graphs = False
                return self._eager
            diff = self._captured.mismatch(policy, obs)
            if diff is not None:  # the graph checks itself on its first replay
                replay_failed("rollout acting", diff)
                self.cuda_graphs, self._captured = False, None
                return self._eager
        assert self._captured is not None
        return self._captured

    # --- one rollout --------------------------------------------------------------------------

    def collect(self, env: VecEnv, callback: BaseCallback, buffer: RolloutBuffer, n_rollout_steps: int) -> bool:
        """One rollout of ``n_rollout_steps`` per env (replaces ``collect_rollouts``).

        :return: False when a callback stopped the rollout early (as in SB3)
        """
        algo = self.algo
        policy = algo.policy
        assert algo._last_obs is not None, "No previous observation was provided"
        policy.set_training_mode(False)
        buffer.reset()
        callback.on_rollout_start()
        act = self._acting(algo._last_obs)  # type: ignore[arg-type]
        low, high = algo.action_space.low, algo.action_space.high  # type: ignore[union-attr]
        new_obs: np.ndarray = algo._last_obs  # type: ignore[assignment]
        dones = algo._last_episode_starts
        for step in range(n_rollout_steps):
            acted = act(algo._last_obs)  # type: ignore[arg-type]
            actions = acted.actions.cpu().numpy()  # the step's one device-to-host copy
            self.values[step].copy_(acted.values.flatten())
            self.log_probs[step].copy_(acted.log_probs)
            # Unbounded Gaussian samples are clipped to the env's bounds, squashed ones rescaled.
            env_actions = policy.unscale_action(actions) if policy.squash_output else np.clip(actions, low, high)
            new_obs, rewards, dones, infos = env.step(env_actions)
            algo.num_timesteps += env.num_envs
            callback.update_locals(locals())
            if not callback.on_step():
                self._flush(buffer, step)
                return False
            algo._update_info_buffer(infos, dones)
            self._bootstrap_truncated(rewards, dones, infos)
            self._store(buffer, algo._last_obs, actions, rewards, algo._last_episode_starts)  # type: ignore[arg-type]
            algo._last_obs = new_obs  # type: ignore[assignment]
            algo._last_episode_starts = dones
        with torch.no_grad():
            last_values = policy.predict_values(obs_as_tensor(new_obs, self.device))  # type: ignore[arg-type]
        self._flush(buffer, n_rollout_steps)
        buffer.compute_returns_and_advantage(last_values=last_values, dones=dones)  # type: ignore[arg-type]
        callback.update_locals(locals())
        callback.on_rollout_end()
        return True

    def _bootstrap_truncated(self, rewards: np.ndarray, dones: np.ndarray, infos: list[dict]) -> None:
        """A time-limit end is not a terminal state: add gamma * V(final obs) to its reward (SB3 #633)."""
        algo = self.algo
        for idx, done in enumerate(dones):
            info = infos[idx]
            if done and info.get("terminal_observation") is not None and info.get("TimeLimit.truncated", False):
                terminal_obs = algo.policy.obs_to_tensor(info["terminal_observation"])[0]
                with torch.no_grad():
                    terminal_value = algo.policy.predict_values(terminal_obs)[0]  # type: ignore[arg-type]
                rewards[idx] += (algo.gamma * terminal_value).cpu().numpy()[0]

    @staticmethod
    def _store(buffer: RolloutBuffer, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray, starts: np.ndarray) -> None:
        """``RolloutBuffer.add`` without the values and log-probabilities (written by :meth:`_flush`)."""
        pos = buffer.pos
        buffer.observations[pos] = np.array(obs)
        buffer.actions[pos] = np.array(actions.reshape((buffer.n_envs, buffer.action_dim)))
        buffer.rewards[pos] = np.array(rewards)
        buffer.episode_starts[pos] = np.array(starts)
        buffer.pos += 1
        buffer.full = buffer.pos == buffer.buffer_size

    def _flush(self, buffer: RolloutBuffer, n_steps: int) -> None:
        """The rollout's values and log-probabilities into the buffer: one copy each."""
        if n_steps:
            buffer.values[:n_steps] = self.values[:n_steps].cpu().numpy()
            buffer.log_probs[:n_steps] = self.log_probs[:n_steps].cpu().numpy()
