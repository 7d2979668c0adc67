"""Gymnasium wrappers shared by the suites: episode success flags and the smoke-task transform."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class InfoSuccess(gym.Wrapper):
    """Episode success = ``info["success"]`` true at any step (Continual World protocol).

    ``info["is_success"]`` (read by SB3's success-rate buffer and our evaluator) is set on every
    step to the running any-step flag, so the value on the episode's last step is the verdict.
    ``info["success_last"]`` is the step's own flag: on the last step, success at the last step
    (the SPHERE authors' code reads that one).
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self._success = False

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self._success = False
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        now = bool(info.get("success", False))
        self._success = self._success or now
        info["is_success"] = self._success
        info["success_last"] = now
        return obs, reward, bool(terminated), bool(truncated), info


class ReturnSuccess(gym.Wrapper):
    """Episode success = undiscounted episode return >= ``success_bar`` (HumanoidBench, smoke).

    ``info["is_success"]`` is the running verdict (final on the last step); ``terminated`` is cast
    to a Python bool because HumanoidBench returns ``numpy.bool_``.

    :param success_bar: the return threshold (HumanoidBench: stand 800, others 700)
    """

    def __init__(self, env: gym.Env, success_bar: float) -> None:
        super().__init__(env)
        self.success_bar = float(success_bar)
        self._return = 0.0

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self._return = 0.0
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._return += float(reward)
        info["is_success"] = self._return >= self.success_bar
        return obs, float(reward), bool(terminated), bool(truncated), info


class PermuteObsFlipAction(gym.Wrapper):
    """Fixed observation permutation and action sign: a new task with the same spaces (smoke suite).

    The observation box becomes symmetric, ``[-b, b]`` with ``b`` the largest inner bound.

    :param permutation: ``obs_new[i] = obs[permutation[i]]``
    :param action_sign: +1 or -1, multiplies the action before the inner env sees it
    """

    def __init__(self, env: gym.Env, permutation: Sequence[int], action_sign: float = 1.0) -> None:
        super().__init__(env)
        box = env.observation_space
        assert isinstance(box, spaces.Box) and box.shape is not None and len(box.shape) == 1
        perm = np.asarray(permutation, dtype=np.int64)
        if sorted(perm.tolist()) != list(range(box.shape[0])):
            raise ValueError(f"permutation {list(permutation)} is not a permutation of range({box.shape[0]})")
        if action_sign not in (1.0, -1.0):
            raise ValueError(f"action_sign must be 1 or -1, got {action_sign}")
        self.permutation = perm
        self.action_sign = float(action_sign)
        # Symmetric bounds shared by every permutation, so all tasks have identical spaces.
        bound = float(np.max(np.abs(np.concatenate([box.low, box.high]))))
        self.observation_space = spaces.Box(-bound, bound, shape=box.shape, dtype=box.dtype)

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        return obs[self.permutation], info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(self.action_sign * np.asarray(action))
        return obs[self.permutation], reward, terminated, truncated, info
