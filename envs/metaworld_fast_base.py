"""What the fast path's per-task methods share (:mod:`rl_moe.envs.metaworld_fast_tasks` and
:mod:`rl_moe.envs.metaworld_fast_grasp`): the env as MetaWorld's own class sees it, the attributes
they read, and object positions and orientations read by ids looked up once."""

from __future__ import annotations

from typing import Any

import numpy as np

from rl_moe.envs.metaworld_fast_math import quat_from_matrix


def plain(env: Any) -> Any:
    """The env as its own MetaWorld class sees it (``super()`` from the fast subclass)."""
    return super(type(env), env)


class TaskBase:
    """What the task methods read from the fast env (``_fast_*``: set by ``make_fast`` and
    ``fast_class``). For type checkers only: ``fast_class`` copies just the task's own methods."""

    data: Any
    model: Any
    _fast_ids: Any
    _fast_reward_utils: Any
    _fast_task: type
    reward_function_version: str


def v2_ready(env: Any) -> bool:
    """Whether the rewritten reward applies: the current reward, after a reset has set the target
    and the object's start (otherwise MetaWorld's own code runs, and asserts as it does)."""
    return env.reward_function_version == "v2" and env._target_pos is not None and env.obj_init_pos is not None  # type: ignore[no-any-return]


def geom_pos(env: TaskBase, name: str) -> np.ndarray:
    """``data.geom(name).xpos``: a view, as MetaWorld's."""
    i = env._fast_ids.lookup("geom", name)
    if i < 0:
        return plain(env)._get_pos_objects()  # type: ignore[no-any-return]  (raises as MetaWorld does)
    return env.data.geom_xpos[i]  # type: ignore[no-any-return]


def geom_quat(env: TaskBase, name: str) -> np.ndarray:
    """``Rotation.from_matrix(data.geom(name).xmat.reshape(3, 3)).as_quat()`` (the fast path's
    scipy replacement reads it the same way)."""
    i = env._fast_ids.lookup("geom", name)
    if i < 0:
        return plain(env)._get_quat_objects()  # type: ignore[no-any-return]  (raises as MetaWorld does)
    return quat_from_matrix(env.data.geom_xmat[i].reshape(3, 3))
