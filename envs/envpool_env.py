"""EnvPool's native MetaWorld v3 behind SB3's ``VecEnv`` contract, with our CW protocol.

EnvPool (``pip install 'rl_moe[envpool]'``) steps MetaWorld's Sawyer tasks in C++ threads. This
adapter makes it return what the official in-process envs return through
:class:`~rl_moe.envs.factories.EnvFactory` (time limit, :class:`~rl_moe.envs.wrappers.InfoSuccess`,
SB3 ``Monitor``, ``DummyVecEnv``):

- goal-observable observations (``partially_observable=False``) in the official env's
  observation space (float64, the same bounds), so checkpoints move between backends;
- ``episode_length``-step episodes ending in truncation, never termination, so PPO bootstraps;
- a fresh goal at every reset and one seed per sub-env (``env_seed``), as the factories give;
- ``info["is_success"]`` from the env's own ``success`` at any step of the episode, and
  ``info["episode"]``, ``terminal_observation`` and ``TimeLimit.truncated`` at episode ends.

EnvPool resets a finished env on the *next* ``step`` call (the action is ignored); SB3 expects
the reset observation in the same step. So finished envs are reset explicitly, by id, at once.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvObs, VecEnvStepReturn

from rl_moe.errors import MissingDependencyError

#: What to type when the package is missing (the ``envpool`` extra pins a tested version).
INSTALL_HINT = "pip install 'rl_moe[envpool]'  (or: pip install 'envpool>=1.2.4,<1.3')"

#: Per-step info keys of MetaWorld v3 (EnvPool adds env_id, task_id, elapsed_step and players).
METAWORLD_INFO_KEYS: tuple[str, ...] = (
    "success", "near_object", "grasp_success", "grasp_reward", "in_place_reward", "obj_to_target", "unscaled_reward",
)  # fmt: skip


#: Tasks whose EnvPool version passed the statistical check against the official env
#: (tests/test_envpool.py, scripted experts, 50 episodes; docs/continual.md, "Env backends").
ENVPOOL_VERIFIED: frozenset[str] = frozenset({
    "push-wall-v3", "faucet-close-v3", "push-back-v3", "stick-pull-v3", "handle-press-side-v3", "push-v3",
    "window-close-v3",
})  # fmt: skip

#: Tasks whose EnvPool version failed that check (envpool 1.2.5), and how: runs keep them on the
#: official envs, with a note.
ENVPOOL_MISMATCHED: dict[str, str] = {
    "hammer-v3": "from each env's second episode on, the scripted policy's return is ~270 instead of ~1,300",
    "shelf-place-v3": "from each env's second episode on, the scripted policy succeeds in 0% of episodes instead of ~90%",
    "peg-unplug-side-v3": "the peg's orientation varies 1.5-3x more along the scripted policy's trajectories",
}


def envpool_installed() -> bool:
    """Whether ``import envpool`` would find the package (nothing is imported)."""
    return importlib.util.find_spec("envpool") is not None


def check_envpool() -> None:
    """:class:`MissingDependencyError` naming the install command when EnvPool is absent."""
    if not envpool_installed():
        raise MissingDependencyError(f"--vec-env envpool needs the envpool package; install it with: {INSTALL_HINT}")


def envpool_task_id(task: str) -> str:
    """EnvPool's id of an official MetaWorld task name: ``faucet-close-v3`` -> ``MetaWorld/FaucetClose-v3``."""
    name, version = task.rsplit("-", 1)
    return "MetaWorld/" + "".join(w[:1].upper() + w[1:] for w in name.split("-")) + "-" + version


def official_observation_space() -> gym.spaces.Box:
    """The observation space of the official goal-observable MetaWorld v3 env (identical for
    every task), built without constructing an env."""
    from metaworld.sawyer_xyz_env import SawyerXYZEnv  # lazy: loads mujoco; only MetaWorld runs need it

    low, high = SawyerXYZEnv._HAND_SPACE.low, SawyerXYZEnv._HAND_SPACE.high  # type: ignore[attr-defined]
    return _official_space_from(low, high)


def _official_space_from(hand_low: np.ndarray, hand_high: np.ndarray) -> gym.spaces.Box:
    # Layout of SawyerXYZEnv.sawyer_observation_space: hand (3), gripper (1), two objects (14),
    # the same for the previous frame (18), goal (3). Objects are unbounded; the goal bounds are 0.
    obj = np.full(14, np.inf)
    low = np.concatenate([hand_low, [-1.0], -obj, hand_low, [-1.0], -obj, np.zeros(3)])
    high = np.concatenate([hand_high, [1.0], obj, hand_high, [1.0], obj, np.zeros(3)])
    return gym.spaces.Box(low, high, dtype=np.float64)


class EnvPoolMetaWorld(VecEnv):
    """``n`` copies of one MetaWorld v3 task in one EnvPool, with our episode protocol.

    :param task: official task name, e.g. ``faucet-close-v3``
    :param seeds: one env seed per sub-env (the factories' seeds)
    :param episode_length: steps per episode (CW: 200)
    :param num_threads: EnvPool worker threads (they step while Python waits)
    :param observation_space: the official env's space, so SB3 sees the same space on either backend
    """

    def __init__(
        self, task: str, seeds: Sequence[int], episode_length: int, num_threads: int, observation_space: gym.spaces.Box
    ) -> None:
        check_envpool()
        import envpool  # lazy: optional dependency (the envpool extra)

        n = len(seeds)
        self.task, self.seeds, self.episode_length = task, [int(s) for s in seeds], int(episode_length)
        self.num_threads = int(num_threads)
        self.pool = envpool.make_gymnasium(
            envpool_task_id(task), num_envs=n, batch_size=n, num_threads=self.num_threads,
            max_episode_steps=self.episode_length, partially_observable=False, env_seed=self.seeds,
            seed=self.seeds[0],
        )  # fmt: skip
        self.render_mode = None
        super().__init__(n, observation_space, self.pool.action_space)
        self._success = np.zeros(n, dtype=bool)
        self._return = np.zeros(n, dtype=np.float64)
        self._length = np.zeros(n, dtype=np.int64)
        self._t0 = time.time()
        self._actions: np.ndarray | None = None

    # ---- the VecEnv contract ----------------------------------------------------------------
    def reset(self) -> VecEnvObs:
        """Reset every sub-env. Seeds passed through :meth:`seed` are ignored, as the official
        MetaWorld env ignores ``reset(seed=)``: the seeds are the constructor's."""
        obs, _ = self.pool.reset()
        self._success[:], self._return[:], self._length[:] = False, 0.0, 0
        self._reset_seeds()
        self._reset_options()
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = np.asarray(actions, dtype=np.float32).reshape(self.num_envs, -1)

    def step_wait(self) -> VecEnvStepReturn:
        assert self._actions is not None, "step_async was not called"
        obs, reward, terminated, truncated, info = self.pool.step(self._actions)
        self._actions = None
        # Sync mode returns the envs in id order; sorting by id costs nothing and makes sure.
        order = np.argsort(np.asarray(info["env_id"]))
        obs, reward, terminated, truncated = obs[order], reward[order], terminated[order], truncated[order]
        now = np.asarray(info["success"])[order] > 0
        self._success |= now
        self._return += reward
        self._length += 1
        dones = np.logical_or(terminated, truncated)
        cut = truncated & ~terminated  # DummyVecEnv writes this key at every step
        infos: list[dict[str, Any]] = [
            {**{k: float(info[k][order[i]]) for k in METAWORLD_INFO_KEYS}, "is_success": bool(self._success[i]), "success_last": bool(now[i]), "TimeLimit.truncated": bool(cut[i])}
            for i in range(self.num_envs)
        ]
        finished = np.flatnonzero(dones)
        if finished.size:
            now = round(time.time() - self._t0, 6)
            for i in finished:
                infos[i]["terminal_observation"] = obs[i].copy()
                # As SB3's Monitor(info_keywords=("is_success",)) writes it.
                episode = {"r": round(float(self._return[i]), 6), "l": int(self._length[i]), "t": now}
                infos[i]["episode"] = {**episode, "is_success": bool(self._success[i])}
            reset_obs, reset_info = self.pool.reset(finished.astype(np.int32))
            obs[np.asarray(reset_info["env_id"])] = reset_obs
            self._success[finished], self._return[finished], self._length[finished] = False, 0.0, 0
        return obs, reward.astype(np.float32), dones, infos

    def close(self) -> None:
        self.pool.close()

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        # SB3's VecEnv API passes attribute names; EnvPool's sub-envs share this object's
        return [getattr(self, attr_name) for _ in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        setattr(self, attr_name, value)  # SB3's VecEnv API, by attribute name

    def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **method_kwargs: Any) -> list[Any]:
        raise AttributeError(f"EnvPool envs have no per-env method {method_name!r}")

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        # The adapter does what Monitor does (episode stats in the infos), so say so: SB3's
        # evaluate_policy then trusts info["episode"] as it would with Monitor.
        from stable_baselines3.common.monitor import Monitor

        return [wrapper_class is Monitor for _ in self._get_indices(indices)]
