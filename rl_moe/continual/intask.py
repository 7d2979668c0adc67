"""In-task checkpoints: a PPO run stopped inside a task resumes at its last rollout boundary, not
at the task's start (docs/continual.md, "What a resume reproduces").

At every rollout boundary (after an update, before the next rollout) :class:`InTaskCheckpoint`
captures in memory everything the next rollout depends on: the policy and Adam state, SB3's
counters, last observations and episode buffers, every random generator, the regularizers'
state, the periodic-evaluation curve and schedule, the plasticity probe's schedule, and the env
state where the backend lets this process read it (:mod:`rl_moe.envs.envstate`). It writes the
capture to ``checkpoints/in_task.pkl`` every ``checkpoint.every_steps`` env steps or
``checkpoint.every_minutes`` minutes, whichever comes first, and on Ctrl-C or SIGTERM (the last
boundary's capture). One file at a time, written atomically; it is removed once the task's own
checkpoint is on disk.

TD3 is not covered: its replay buffer (up to a million transitions) would be the checkpoint; a
TD3 run resumes at the start of its unfinished task, as before.
"""

from __future__ import annotations

import copy
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.vec_env import VecEnv

from rl_moe.algos.common import RegularizedMixin
from rl_moe.atomic import write_atomic
from rl_moe.cli import reraise_interrupt
from rl_moe.continual import rng
from rl_moe.envs.envstate import capturable, restore_vec, snapshot_vec

#: File format version of ``in_task.pkl``.
VERSION = 1


@dataclass(frozen=True)
class CheckpointSettings:
    """When a run writes its in-task checkpoint (PPO; ``--set checkpoint.every_steps=...``).

    :param every_steps: env steps between in-task checkpoints (at the first rollout boundary past
        it; 0: never by steps)
    :param every_minutes: minutes between in-task checkpoints (0: never by time)
    """

    every_steps: int = 100_000
    every_minutes: float = 15.0


def capture(model: BaseAlgorithm, env: VecEnv, task: int, task_start: int, curve: dict[str, list], callbacks: dict[str, Any], seconds: float) -> dict[str, Any]:
    """Everything the next rollout of ``model`` depends on, copied (module docstring).

    :param callbacks: name -> the state of the task's scheduled callbacks (evaluation, probe)
    :param seconds: training seconds of the task so far
    """
    assert isinstance(model, OnPolicyAlgorithm)
    state: dict[str, Any] = {
        "version": VERSION,
        "task": task,
        "task_start": task_start,
        "step": int(model.num_timesteps),
        "seconds": seconds,
        "policy": {k: v.detach().cpu().clone() for k, v in model.policy.state_dict().items()},
        "optimizer": copy.deepcopy(model.policy.optimizer.state_dict()),
        "rng": rng.capture(model),
        # SB3's rollout state: the observations the next step acts on, not in its .zip parameters.
        "last_obs": copy.deepcopy(model._last_obs),
        "last_episode_starts": copy.deepcopy(model._last_episode_starts),
        "last_original_obs": copy.deepcopy(model._last_original_obs),
        "curve": copy.deepcopy(curve),
        "callbacks": copy.deepcopy(callbacks),
        "envs": snapshot_vec(env),
    }
    if isinstance(model, RegularizedMixin):
        state["regularizers"] = copy.deepcopy(model.regularizer_state())
    return state


def restore(model: BaseAlgorithm, env: VecEnv, state: dict[str, Any]) -> bool:
    """Put :func:`capture`'s state into a model and env built for the same task; returns whether
    the env state was restored (False: the backend's envs start fresh episodes)."""
    assert isinstance(model, OnPolicyAlgorithm)
    model.policy.load_state_dict(state["policy"])
    model.policy.optimizer.load_state_dict(state["optimizer"])
    if isinstance(model, RegularizedMixin) and "regularizers" in state:
        model.load_regularizer_state(state["regularizers"])
    model.num_timesteps = int(state["step"])
    restored = state["envs"] is not None and capturable(env)
    if restored:
        restore_vec(env, state["envs"])
        model._last_obs = copy.deepcopy(state["last_obs"])
        model._last_episode_starts = copy.deepcopy(state["last_episode_starts"])
        model._last_original_obs = copy.deepcopy(state["last_original_obs"])
    else:  # SB3 resets the envs when learn() starts
        model._last_obs = None  # type: ignore[assignment]
    rng.restore(model, state["rng"])
    return restored


def write(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` atomically (a kill mid-write leaves the previous file)."""
    path.parent.mkdir(parents=True, exist_ok=True)

    def dump(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            pickle.dump(state, fh, protocol=pickle.HIGHEST_PROTOCOL)

    write_atomic(path, dump)


def read(path: Path) -> dict[str, Any] | None:
    """The saved state, or None when there is none.

    :raises ValueError: if the file is unreadable or not an in-task checkpoint of this version
    """
    if not path.is_file():
        return None
    try:
        with open(path, "rb") as fh:
            state = pickle.load(fh)
    except Exception as exc:  # a damaged pickle raises many types
        reraise_interrupt(exc)
        raise ValueError(f"unreadable ({type(exc).__name__}: {exc})") from None
    if not isinstance(state, dict) or state.get("version") != VERSION:
        raise ValueError(f"not an in-task checkpoint of version {VERSION}")
    return state


class InTaskCheckpoint(BaseCallback):
    """Captures the run at every rollout boundary and writes it when due (module docstring).

    Must come last among the task's callbacks, so that what they do at the boundary (an
    evaluation, its TensorBoard points) is inside the capture.

    :param path: ``checkpoints/in_task.pkl``
    :param settings: the intervals
    :param task: the task's index
    :param task_start: the task's first global step
    :param curve: the task's periodic-evaluation curve (the scheduler appends to it)
    :param callback_states: ``() -> {name: state}`` of the scheduled callbacks
    :param resumed_at: the step a resume continues from (no capture is written there again)
    :param seconds_before: training seconds of the task before this process (a resume)
    :param on_write: called with the step after each write (results.json records it)
    """

    def __init__(
        self, path: Path, settings: CheckpointSettings, task: int, task_start: int, curve: dict[str, list],
        callback_states: Callable[[], dict[str, Any]], resumed_at: int | None = None, seconds_before: float = 0.0,
        on_write: Callable[[int], None] | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        self.path, self.settings, self.task, self.task_start = path, settings, task, task_start
        self.curve, self.callback_states, self.on_write = curve, callback_states, on_write
        self.latest: dict[str, Any] | None = None
        self.written_step = resumed_at if resumed_at is not None else task_start
        self.seconds_before = seconds_before
        self._t0 = self._written_at = time.monotonic()
        self.seconds_writing = 0.0  # capture and write time, for the cost figure

    def _on_training_start(self) -> None:
        self._t0 = self._written_at = time.monotonic()

    def _on_rollout_start(self) -> None:
        step = int(self.model.num_timesteps)
        if step <= self.written_step or step == self.task_start:
            return
        t = time.monotonic()
        seconds = self.seconds_before + (t - self._t0)
        self.latest = capture(self.model, self.training_env, self.task, self.task_start, self.curve, self.callback_states(), seconds)
        s = self.settings
        due = (s.every_steps > 0 and step - self.written_step >= s.every_steps) or (s.every_minutes > 0 and t - self._written_at >= 60 * s.every_minutes)
        if due:
            self.flush()
        self.seconds_writing += time.monotonic() - t

    def flush(self) -> None:
        """Write the latest capture if it is newer than the file (the end of a Ctrl-C or SIGTERM)."""
        if self.latest is None or self.latest["step"] <= self.written_step:
            return
        write(self.path, self.latest)
        self.written_step = int(self.latest["step"])
        self._written_at = time.monotonic()
        if self.on_write is not None:
            self.on_write(self.written_step)

    def _on_step(self) -> bool:
        return True

