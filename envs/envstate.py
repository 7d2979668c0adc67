"""The state of in-process envs, saved and put back, so a run resumed inside a task steps on exactly
as the uninterrupted one would (the official MetaWorld envs: bit for bit; see docs/continual.md,
"What a resume reproduces").

An env is a stack of wrappers over the raw env. Of every layer the snapshot keeps the plain
attributes (numbers, strings, numpy arrays, and lists, tuples and dicts of them: the episode's step
count, success flags, positions, Monitor's episode sums), the state of every numpy ``Generator``,
and for MuJoCo envs the integration state of ``MjData`` (``mj_getState`` with
``mjSTATE_INTEGRATION``: time, positions, velocities, actuation, warm start, controls, mocap) plus
the model fields a task's reset moves (body, site and geom placements). About 13 kB per MetaWorld
env. Objects it does not know (spaces, renderers, the simulator's derived quantities) are left as
the freshly built env has them; the next ``mj_step`` recomputes the derived ones from the state.

Only :class:`~stable_baselines3.common.vec_env.DummyVecEnv` is captured: worker processes and
native pools (EnvPool) keep their state where this process cannot read it.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv, VecNormalize

#: MjModel fields that MetaWorld's resets write (object and goal placements).
MODEL_FIELDS: tuple[str, ...] = ("body_pos", "body_quat", "site_pos", "site_quat", "geom_pos", "geom_quat")
_SCALARS = (bool, int, float, str, type(None), np.generic)
#: VecNormalize's running statistics and per-env state.
_VECNORMALIZE: tuple[str, ...] = ("obs_rms", "ret_rms", "returns", "old_obs", "old_reward")


def _plain(value: Any, depth: int = 0) -> bool:
    if isinstance(value, _SCALARS):
        return True
    if isinstance(value, np.ndarray):
        return value.dtype != object
    if depth < 4 and isinstance(value, (list, tuple)):
        return all(_plain(v, depth + 1) for v in value)
    if depth < 4 and isinstance(value, dict):
        return all(isinstance(k, (str, int)) and _plain(v, depth + 1) for k, v in value.items())
    return False


def _layers(env: gym.Env) -> Iterator[Any]:
    layer: Any = env
    while True:
        yield layer
        if not isinstance(layer, gym.Wrapper):
            return
        layer = layer.env


def snapshot_env(env: gym.Env) -> list[dict[str, tuple[str, Any]]]:
    """Per wrapper layer (outermost first): attribute -> (kind, saved value)."""
    # An env holding MuJoCo state has loaded MuJoCo's bindings; other families never load them here.
    mujoco = sys.modules.get("mujoco")

    out = []
    for layer in _layers(env):
        saved: dict[str, tuple[str, Any]] = {}
        for name, value in vars(layer).items():
            if isinstance(value, np.random.Generator):
                saved[name] = ("rng", copy.deepcopy(value.bit_generator.state))
            elif mujoco is not None and isinstance(value, mujoco.MjData):
                spec = mujoco.mjtState.mjSTATE_INTEGRATION
                state = np.empty(mujoco.mj_stateSize(layer.model, spec))
                mujoco.mj_getState(layer.model, value, state, spec)
                saved[name] = ("mjdata", state)
            elif mujoco is not None and isinstance(value, mujoco.MjModel):
                saved[name] = ("mjmodel", {f: getattr(value, f).copy() for f in MODEL_FIELDS})
            elif _plain(value):
                saved[name] = ("value", copy.deepcopy(value))
        out.append(saved)
    return out


def restore_env(env: gym.Env, snapshot: list[dict[str, tuple[str, Any]]]) -> None:
    """Put :func:`snapshot_env`'s values back into an env built by the same factory.

    :raises ValueError: if the env's layers differ from the snapshot's
    """
    layers = list(_layers(env))
    if len(layers) != len(snapshot):
        raise ValueError(f"the env has {len(layers)} wrapper layers, the saved state {len(snapshot)}")
    for layer, saved in zip(layers, snapshot):
        for name, (kind, value) in saved.items():
            if kind == "rng":
                getattr(layer, name).bit_generator.state = value
            elif kind == "mjdata":
                mujoco = sys.modules["mujoco"]  # loaded: the env holds MuJoCo state, as the snapshot's did
                # No mj_forward after it: that would overwrite the warm start the state carries.
                mujoco.mj_setState(layer.model, getattr(layer, name), value, mujoco.mjtState.mjSTATE_INTEGRATION)
            elif kind == "mjmodel":
                model = getattr(layer, name)
                for field, array in value.items():
                    getattr(model, field)[...] = array
            else:
                setattr(layer, name, copy.deepcopy(value))


def capturable(venv: VecEnv) -> bool:
    """Whether :func:`snapshot_vec` can save this backend's env state (in-process envs only)."""
    return isinstance(venv.venv if isinstance(venv, VecNormalize) else venv, DummyVecEnv)


def snapshot_vec(venv: VecEnv) -> dict[str, Any] | None:
    """Every sub-env's state and, under VecNormalize, its running statistics and per-env returns;
    None for a backend whose envs this process cannot read."""
    base = venv.venv if isinstance(venv, VecNormalize) else venv
    if not isinstance(base, DummyVecEnv):
        return None
    out: dict[str, Any] = {"envs": [snapshot_env(e) for e in base.envs]}
    if isinstance(venv, VecNormalize):
        own = vars(venv)  # old_obs and old_reward exist once the envs have stepped
        out["vecnormalize"] = copy.deepcopy({k: own[k] for k in _VECNORMALIZE if k in own})
    return out


def restore_vec(venv: VecEnv, saved: dict[str, Any]) -> None:
    """Put :func:`snapshot_vec`'s state back into a vec env built the same way."""
    base = venv.venv if isinstance(venv, VecNormalize) else venv
    assert isinstance(base, DummyVecEnv)
    if len(base.envs) != len(saved["envs"]):
        raise ValueError(f"the run has {len(base.envs)} envs, the saved state {len(saved['envs'])}")
    for env, snap in zip(base.envs, saved["envs"]):
        restore_env(env, snap)
    if isinstance(venv, VecNormalize) and "vecnormalize" in saved:
        for name, value in copy.deepcopy(saved["vecnormalize"]).items():
            setattr(venv, name, value)
