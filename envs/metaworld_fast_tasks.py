"""The fast path's per-task parts: a MetaWorld task's own reward and object readings, bit for bit.

Each task class of metaworld 3.1.1 computes its reward in ``compute_reward`` with 10–30 numpy calls
on 3-vectors, and reads its objects through MuJoCo's named accessors (``data.geom("objGeom")``),
which look the name up on every call. For the tasks in :data:`TASKS`, the methods below do the same
floating-point operations in the same order on the same arrays: ``numpy.linalg.norm`` as its own
``dot`` and ``sqrt`` (:func:`~rl_moe.envs.metaworld_fast_math.norm`), objects by ids looked up once,
constants built once. Values, types and ``info`` stay MetaWorld's (tests/test_metaworld_fast.py
compares the bytes of every step on every CW10 task). Only the current reward (``v2``) is rewritten;
the earlier one goes to MetaWorld's own code. CW10's handle-press-side and window-close are not
here: their rewards hold two vector norms each, too little to pay for a rewrite. Hammer, push-wall,
faucet-close, push and push-back are below; stick-pull, shelf-place and peg-unplug-side in
:mod:`rl_moe.envs.metaworld_fast_grasp`; what they share in :mod:`rl_moe.envs.metaworld_fast_base`.

:func:`rl_moe.envs.metaworld_fast.fast_class` puts a task's methods in where the env's class still
uses that task class's own: a subclass that overrides one keeps it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from rl_moe.envs.metaworld_fast_base import TaskBase, geom_pos, geom_quat, plain, v2_ready
from rl_moe.envs.metaworld_fast_grasp import FastPegUnplugSide, FastShelfPlace, FastStickPull
from rl_moe.envs.metaworld_fast_math import norm


# ---- hammer-v3 -----------------------------------------------------------------------------------
_HAMMER_HEAD = np.array([0.16, 0.06, 0.0])
_UPRIGHT_QUAT = np.array([1.0, 0.0, 0.0, 0.0])


class FastHammer(TaskBase):
    """``SawyerHammerEnvV3``."""

    _target_pos: np.ndarray

    def _get_pos_objects(self) -> np.ndarray:
        hammer, nail = self._fast_ids.lookup("body", "hammer"), self._fast_ids.lookup("body", "nail_link")
        if hammer < 0 or nail < 0:
            return plain(self)._get_pos_objects()  # raises as MetaWorld does
        xpos = self.data.xpos
        return np.concatenate((xpos[hammer], xpos[nail]))  # hstack of the two copies

    def _get_quat_objects(self) -> np.ndarray:
        hammer, nail = self._fast_ids.lookup("body", "hammer"), self._fast_ids.lookup("body", "nail_link")
        if hammer < 0 or nail < 0:
            return plain(self)._get_quat_objects()
        xquat = self.data.xquat
        return np.concatenate((xquat[hammer], xquat[nail]))

    def compute_reward(self, actions: np.ndarray, obs: np.ndarray) -> tuple[float, float, float, float, bool]:
        nail_joint = self._fast_ids.lookup("joint", "NailSlideJoint")
        if self.reward_function_version != "v2" or nail_joint < 0:
            return plain(self).compute_reward(actions, obs)  # type: ignore[no-any-return]
        hand = obs[:3]
        hammer = obs[4:7]
        hammer_head = hammer + _HAMMER_HEAD
        # MetaWorld's caging reward treats the object as a sphere: the handle's x follows the hand.
        hammer_threshed = hammer.copy()
        threshold = self._fast_task.HAMMER_HANDLE_LENGTH / 2.0  # type: ignore[attr-defined]
        if abs(hammer[0] - hand[0]) < threshold:
            hammer_threshed[0] = hand[0]
        reward_quat = max(1.0 - float(norm(obs[7:11] - _UPRIGHT_QUAT)) / 0.4, 0.0)
        reward_grab = self._gripper_caging_reward(  # type: ignore[attr-defined]
            actions, hammer_threshed, object_reach_radius=0.01, obj_radius=0.015, pad_success_thresh=0.02,
            xz_thresh=0.01, high_density=True,
        )  # fmt: skip
        lifted = hammer_head[2] > 0.02
        in_place = self._fast_reward_utils.tolerance(norm(self._target_pos - hammer_head), bounds=(0, 0.02), margin=0.2, sigmoid="long_tail")
        reward_in_place = 0.1 * float(lifted) + 0.9 * in_place
        reward = (2.0 * reward_grab + 6.0 * reward_in_place) * reward_quat
        # the joint's qpos is one number: MetaWorld's bool() of its one-element comparison
        success = bool(self.data.qpos[self.model.jnt_qposadr[nail_joint]] > 0.09)
        if success and reward > 5.0:
            reward = 10.0
        return reward, reward_grab, reward_quat, reward_in_place, success


# ---- push-wall-v3 --------------------------------------------------------------------------------
_PUSH_WALL_SCALING = np.array([3.0, 1.0, 1.0])


class FastPushWall(TaskBase):
    """``SawyerPushWallEnvV3``."""

    _target_pos: np.ndarray
    obj_init_pos: np.ndarray

    def _get_pos_objects(self) -> np.ndarray:
        return geom_pos(self, "objGeom")

    def _get_quat_objects(self) -> np.ndarray:
        return geom_quat(self, "objGeom")

    def compute_reward(self, action: np.ndarray, obs: np.ndarray) -> tuple[float, float, float, float, float, float]:
        if not v2_ready(self):
            return plain(self).compute_reward(action, obs)  # type: ignore[no-any-return]
        target_radius = 0.05
        tolerance = self._fast_reward_utils.tolerance
        tcp = self.tcp_center  # type: ignore[attr-defined]
        obj = obs[4:7]
        tcp_opened = obs[3]
        midpoint = np.array([-0.05, 0.77, obj[2]])
        target = self._target_pos
        tcp_to_obj = float(norm(obj - tcp))
        obj_to_midpoint = float(norm((obj - midpoint) * _PUSH_WALL_SCALING))
        obj_to_midpoint_init = float(norm((self.obj_init_pos - midpoint) * _PUSH_WALL_SCALING))
        obj_to_target = float(norm(obj - target))
        obj_to_target_init = float(norm(self.obj_init_pos - target))
        in_place_part1 = tolerance(obj_to_midpoint, bounds=(0, target_radius), margin=obj_to_midpoint_init, sigmoid="long_tail")
        in_place_part2 = tolerance(obj_to_target, bounds=(0, target_radius), margin=obj_to_target_init, sigmoid="long_tail")
        object_grasped = self._gripper_caging_reward(  # type: ignore[attr-defined]
            action, obj, object_reach_radius=0.01, obj_radius=0.015, pad_success_thresh=0.05, xz_thresh=0.005,
            high_density=True,
        )  # fmt: skip
        reward = 2 * object_grasped
        if tcp_to_obj < 0.02 and tcp_opened > 0:
            reward = 2.0 * object_grasped + 1.0 + 4.0 * in_place_part1
            if obj[1] > 0.75:
                reward = 2 * object_grasped + 1.0 + 4.0 + 3.0 * in_place_part2
        if obj_to_target < target_radius:
            reward = 10.0
        # MetaWorld computes the fourth value again, from the same arrays: the same number
        return reward, tcp_to_obj, tcp_opened, obj_to_target, object_grasped, in_place_part2


# ---- faucet-close-v3 -----------------------------------------------------------------------------
_FAUCET_HANDLE_OFFSET = np.array([0.0, 0.0, -0.01])


class FastFaucetClose(TaskBase):
    """``SawyerFaucetCloseEnvV3``."""

    _target_pos: np.ndarray
    _target_radius: float
    obj_init_pos: np.ndarray
    init_tcp: np.ndarray

    def _get_pos_objects(self) -> np.ndarray:
        handle = self._fast_ids.lookup("site", "handleStartClose")
        if handle < 0:
            return plain(self)._get_pos_objects()  # type: ignore[no-any-return]
        return self.data.site_xpos[handle] + _FAUCET_HANDLE_OFFSET  # type: ignore[no-any-return]

    def _get_quat_objects(self) -> np.ndarray:
        base = self._fast_ids.lookup("body", "faucetBase")
        if base < 0:
            return plain(self)._get_quat_objects()  # type: ignore[no-any-return]
        return self.data.xquat[base]  # type: ignore[no-any-return]  (a view, as MetaWorld's)

    def compute_reward(self, action: np.ndarray, obs: np.ndarray) -> tuple[float, float, float, float, float, float]:
        if self.reward_function_version != "v2" or self._target_pos is None:
            return plain(self).compute_reward(action, obs)  # type: ignore[no-any-return]  (asserts as MetaWorld does)
        tolerance = self._fast_reward_utils.tolerance
        obj = obs[4:7]
        tcp = self.tcp_center  # type: ignore[attr-defined]
        target = self._target_pos
        target_to_obj = norm(obj - target)
        target_to_obj_init = norm(self.obj_init_pos - target)
        in_place = tolerance(target_to_obj, bounds=(0, self._target_radius), margin=abs(target_to_obj_init - self._target_radius), sigmoid="long_tail")
        faucet_reach_radius = 0.01
        tcp_to_obj = float(norm(obj - tcp))
        tcp_to_obj_init = norm(self.obj_init_pos - self.init_tcp)
        reach = tolerance(tcp_to_obj, bounds=(0, faucet_reach_radius), margin=abs(tcp_to_obj_init - faucet_reach_radius), sigmoid="gaussian")
        tcp_opened = 0
        reward = 2 * reach + 3 * in_place
        reward *= 2
        reward = 10 if target_to_obj <= self._target_radius else reward
        return reward, tcp_to_obj, tcp_opened, target_to_obj, reach, in_place


# ---- push-v3 and push-back-v3 --------------------------------------------------------------------
class _PushTerms(NamedTuple):
    """The terms push-v3's and push-back-v3's rewards both open with, in MetaWorld's order."""

    obj: np.ndarray
    tcp_opened: Any
    tcp_to_obj: float
    target_to_obj: float
    target_to_obj_init: float
    in_place: float


def _push_terms(env: Any, obs: np.ndarray) -> _PushTerms:
    obj = obs[4:7]
    tcp_to_obj = float(norm(obj - env.tcp_center))
    target_to_obj = float(norm(obj - env._target_pos))
    target_to_obj_init = float(norm(env.obj_init_pos - env._target_pos))
    in_place = env._fast_reward_utils.tolerance(target_to_obj, bounds=(0, env.TARGET_RADIUS), margin=target_to_obj_init, sigmoid="long_tail")
    return _PushTerms(obj, obs[3], tcp_to_obj, target_to_obj, target_to_obj_init, in_place)


class FastPush(TaskBase):
    """``SawyerPushEnvV3`` (its object position is ``get_body_com``, already on the fast path)."""

    TARGET_RADIUS: float
    _target_pos: np.ndarray
    obj_init_pos: np.ndarray

    def _get_quat_objects(self) -> np.ndarray:
        return geom_quat(self, "objGeom")

    def compute_reward(self, action: np.ndarray, obs: np.ndarray) -> tuple[float, float, float, float, float, float]:
        if not v2_ready(self):
            return plain(self).compute_reward(action, obs)  # type: ignore[no-any-return]
        obj, tcp_opened, tcp_to_obj, target_to_obj, target_to_obj_init, in_place = _push_terms(self, obs)
        object_grasped = self._gripper_caging_reward(  # type: ignore[attr-defined]
            action, obj, object_reach_radius=0.01, obj_radius=0.015, pad_success_thresh=0.05, xz_thresh=0.005,
            high_density=True,
        )  # fmt: skip
        reward = 2 * object_grasped
        if tcp_to_obj < 0.02 and tcp_opened > 0:
            reward += 1.0 + reward + 5.0 * in_place
        if target_to_obj < self.TARGET_RADIUS:
            reward = 10.0
        return reward, tcp_to_obj, tcp_opened, target_to_obj, object_grasped, in_place


class FastPushBack(TaskBase):
    """``SawyerPushBackEnvV3`` (its own caging reward stays MetaWorld's)."""

    TARGET_RADIUS: float
    OBJ_RADIUS: float
    _target_pos: np.ndarray
    obj_init_pos: np.ndarray

    def _get_pos_objects(self) -> np.ndarray:
        return geom_pos(self, "objGeom")

    def _get_quat_objects(self) -> np.ndarray:
        return geom_quat(self, "objGeom")

    def compute_reward(self, action: np.ndarray, obs: np.ndarray) -> tuple[float, float, float, float, float, float]:
        if not v2_ready(self):
            return plain(self).compute_reward(action, obs)  # type: ignore[no-any-return]
        obj, tcp_opened, tcp_to_obj, target_to_obj, target_to_obj_init, in_place = _push_terms(self, obs)
        object_grasped = self._gripper_caging_reward(action, obj, self.OBJ_RADIUS)  # type: ignore[attr-defined]
        reward = self._fast_reward_utils.hamacher_product(object_grasped, in_place)
        if (tcp_to_obj < 0.01) and (0 < tcp_opened < 0.55) and (target_to_obj_init - target_to_obj > 0.01):
            reward += 1.0 + 5.0 * in_place
        if target_to_obj < self.TARGET_RADIUS:
            reward = 10.0
        return reward, tcp_to_obj, tcp_opened, target_to_obj, object_grasped, in_place


#: The task classes with their own fast methods, by ``module.qualname`` of the MetaWorld class.
TASKS: dict[str, type] = {
    "metaworld.envs.sawyer_hammer_v3.SawyerHammerEnvV3": FastHammer,
    "metaworld.envs.sawyer_push_wall_v3.SawyerPushWallEnvV3": FastPushWall,
    "metaworld.envs.sawyer_faucet_close_v3.SawyerFaucetCloseEnvV3": FastFaucetClose,
    "metaworld.envs.sawyer_push_v3.SawyerPushEnvV3": FastPush,
    "metaworld.envs.sawyer_push_back_v3.SawyerPushBackEnvV3": FastPushBack,
    "metaworld.envs.sawyer_stick_pull_v3.SawyerStickPullEnvV3": FastStickPull,
    "metaworld.envs.sawyer_shelf_place_v3.SawyerShelfPlaceEnvV3": FastShelfPlace,
    "metaworld.envs.sawyer_peg_unplug_side_v3.SawyerPegUnplugSideEnvV3": FastPegUnplugSide,
}
