"""The fast path's per-task parts: a MetaWorld task's own reward and object readings, bit for bit.

Each task class of metaworld 3.1.1 computes its reward in ``compute_reward`` with 10–30 numpy calls
on 3-vectors, and reads its objects through MuJoCo's named accessors (``data.geom("objGeom")``),
which look the name up on every call. For the tasks in :data:`TASKS`, the methods below do the same
floating-point operations in the same order on the same arrays: ``numpy.linalg.norm`` as its own
``dot`` and ``sqrt`` (:func:`~rl_moe.envs.metaworld_fast_math.norm`), objects by ids looked up once,
constants built once. Values, types and ``info`` stay MetaWorld's (tests/test_metaworld_fast.py
compares the bytes of every step on every CW10 task). Only the current reward (``v2``) is rewritten;
the earlier one goes to MetaWorld's own code. CW10's handle-press-side and window-close are not
here: their rewards hold two vector norms each, too little to pay for a rewrite.

:func:`rl_moe.envs.metaworld_fast.fast_class` puts a task's methods in where the env's class still
uses that task class's own: a subclass that overrides one keeps it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from rl_moe.envs.metaworld_fast_math import norm, quat_from_matrix


def plain(env: Any) -> Any:
    """The env as its own MetaWorld class sees it (``super()`` from the fast subclass)."""
    return super(type(env), env)


class _TaskBase:
    """What the task methods read from the fast env (``_fast_*``: set by ``make_fast`` and
    ``fast_class``). For type checkers only: ``fast_class`` copies just the task's own methods."""

    data: Any
    model: Any
    _fast_ids: Any
    _fast_reward_utils: Any
    _fast_task: type
    reward_function_version: str


def _v2_ready(env: Any) -> bool:
    """Whether the rewritten reward applies: the current reward, after a reset has set the target
    and the object's start (otherwise MetaWorld's own code runs, and asserts as it does)."""
    return env.reward_function_version == "v2" and env._target_pos is not None and env.obj_init_pos is not None  # type: ignore[no-any-return]


def _geom_pos(env: _TaskBase, name: str) -> np.ndarray:
    """``data.geom(name).xpos``: a view, as MetaWorld's."""
    i = env._fast_ids.lookup("geom", name)
    if i < 0:
        return plain(env)._get_pos_objects()  # type: ignore[no-any-return]  (raises as MetaWorld does)
    return env.data.geom_xpos[i]  # type: ignore[no-any-return]


def _geom_quat(env: _TaskBase, name: str) -> np.ndarray:
    """``Rotation.from_matrix(data.geom(name).xmat.reshape(3, 3)).as_quat()`` (the fast path's
    scipy replacement reads it the same way)."""
    i = env._fast_ids.lookup("geom", name)
    if i < 0:
        return plain(env)._get_quat_objects()  # type: ignore[no-any-return]  (raises as MetaWorld does)
    return quat_from_matrix(env.data.geom_xmat[i].reshape(3, 3))


# ---- hammer-v3 -----------------------------------------------------------------------------------
_HAMMER_HEAD = np.array([0.16, 0.06, 0.0])
_UPRIGHT_QUAT = np.array([1.0, 0.0, 0.0, 0.0])


class FastHammer(_TaskBase):
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


class FastPushWall(_TaskBase):
    """``SawyerPushWallEnvV3``."""

    _target_pos: np.ndarray
    obj_init_pos: np.ndarray

    def _get_pos_objects(self) -> np.ndarray:
        return _geom_pos(self, "objGeom")

    def _get_quat_objects(self) -> np.ndarray:
        return _geom_quat(self, "objGeom")

    def compute_reward(self, action: np.ndarray, obs: np.ndarray) -> tuple[float, float, float, float, float, float]:
        if not _v2_ready(self):
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


class FastFaucetClose(_TaskBase):
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


class FastPush(_TaskBase):
    """``SawyerPushEnvV3`` (its object position is ``get_body_com``, already on the fast path)."""

    TARGET_RADIUS: float
    _target_pos: np.ndarray
    obj_init_pos: np.ndarray

    def _get_quat_objects(self) -> np.ndarray:
        return _geom_quat(self, "objGeom")

    def compute_reward(self, action: np.ndarray, obs: np.ndarray) -> tuple[float, float, float, float, float, float]:
        if not _v2_ready(self):
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


class FastPushBack(_TaskBase):
    """``SawyerPushBackEnvV3`` (its own caging reward stays MetaWorld's)."""

    TARGET_RADIUS: float
    OBJ_RADIUS: float
    _target_pos: np.ndarray
    obj_init_pos: np.ndarray

    def _get_pos_objects(self) -> np.ndarray:
        return _geom_pos(self, "objGeom")

    def _get_quat_objects(self) -> np.ndarray:
        return _geom_quat(self, "objGeom")

    def compute_reward(self, action: np.ndarray, obs: np.ndarray) -> tuple[float, float, float, float, float, float]:
        if not _v2_ready(self):
            return plain(self).compute_reward(action, obs)  # type: ignore[no-any-return]
        obj, tcp_opened, tcp_to_obj, target_to_obj, target_to_obj_init, in_place = _push_terms(self, obs)
        object_grasped = self._gripper_caging_reward(action, obj, self.OBJ_RADIUS)  # type: ignore[attr-defined]
        reward = self._fast_reward_utils.hamacher_product(object_grasped, in_place)
        if (tcp_to_obj < 0.01) and (0 < tcp_opened < 0.55) and (target_to_obj_init - target_to_obj > 0.01):
            reward += 1.0 + 5.0 * in_place
        if target_to_obj < self.TARGET_RADIUS:
            reward = 10.0
        return reward, tcp_to_obj, tcp_opened, target_to_obj, object_grasped, in_place


# ---- stick-pull-v3 -------------------------------------------------------------------------------
_CONTAINER_OFFSET = np.array([0.05, 0.0, 0.0])
_YZ_SCALING = np.array([1.0, 1.0, 2.0])
_NO_QUAT = np.array([0.0, 0.0, 0.0, 0.0])


class FastStickPull(_TaskBase):
    """``SawyerStickPullEnvV3``."""

    _target_pos: np.ndarray
    obj_init_pos: np.ndarray
    stick_init_pos: np.ndarray

    def _get_pos_objects(self) -> np.ndarray:
        stick, insertion = self._fast_ids.lookup("body", "stick"), self._fast_ids.lookup("site", "insertion")
        if stick < 0 or insertion < 0:
            return plain(self)._get_pos_objects()  # type: ignore[no-any-return]
        return np.concatenate((self.data.xpos[stick], self.data.site_xpos[insertion]))

    def _get_quat_objects(self) -> np.ndarray:
        stick = self._fast_ids.lookup("body", "stick")
        if stick < 0:
            return plain(self)._get_quat_objects()  # type: ignore[no-any-return]
        return np.concatenate((quat_from_matrix(self.data.xmat[stick].reshape(3, 3)), _NO_QUAT))

    def compute_reward(self, action: np.ndarray, obs: np.ndarray) -> tuple[float, float, float, float, float, float]:
        if not _v2_ready(self):
            return plain(self).compute_reward(action, obs)  # type: ignore[no-any-return]
        target_radius = 0.05
        tolerance, hamacher = self._fast_reward_utils.tolerance, self._fast_reward_utils.hamacher_product
        tcp = self.tcp_center  # type: ignore[attr-defined]
        stick = obs[4:7]
        end_of_stick = self._get_site_pos("stick_end")  # type: ignore[attr-defined]
        container = obs[11:14] + _CONTAINER_OFFSET
        container_init_pos = self.obj_init_pos + _CONTAINER_OFFSET
        handle = obs[11:14]
        tcp_opened = obs[3]
        target = self._target_pos
        tcp_to_stick = float(norm(stick - tcp))
        handle_to_target = float(norm(handle - target))
        stick_to_container = float(norm((stick - container) * _YZ_SCALING))
        stick_in_place_margin = float(norm((self.stick_init_pos - container_init_pos) * _YZ_SCALING))
        stick_in_place = tolerance(stick_to_container, bounds=(0, target_radius), margin=stick_in_place_margin, sigmoid="long_tail")
        stick_to_target = float(norm(stick - target))
        stick_in_place_margin_2 = float(norm(self.stick_init_pos - target))
        stick_in_place_2 = tolerance(stick_to_target, bounds=(0, target_radius), margin=stick_in_place_margin_2, sigmoid="long_tail")
        container_to_target = float(norm(container - target))
        container_in_place_margin = float(norm(self.obj_init_pos - target))
        container_in_place = tolerance(container_to_target, bounds=(0, target_radius), margin=container_in_place_margin, sigmoid="long_tail")
        object_grasped = self._gripper_caging_reward(  # type: ignore[attr-defined]
            action=action, obj_pos=stick, obj_radius=0.014, pad_success_thresh=0.05, object_reach_radius=0.01,
            xz_thresh=0.01, high_density=True,
        )  # fmt: skip
        # `and` keeps its operands' types, as MetaWorld's expression does
        grasp_success = tcp_to_stick < 0.02 and (tcp_opened > 0) and (stick[2] - 0.01 > self.stick_init_pos[2])
        object_grasped = 1 if grasp_success else object_grasped
        in_place_and_object_grasped = hamacher(object_grasped, stick_in_place)
        reward = in_place_and_object_grasped
        if grasp_success:
            reward = 1.0 + in_place_and_object_grasped + 5.0 * stick_in_place
            if self._stick_is_inserted(handle, end_of_stick):  # type: ignore[attr-defined]
                reward = 1.0 + in_place_and_object_grasped + 5.0 + 2.0 * stick_in_place_2 + 1.0 * container_in_place
                if handle_to_target <= 0.12:
                    reward = 10.0
        return reward, tcp_to_stick, tcp_opened, handle_to_target, object_grasped, stick_in_place


# ---- shelf-place-v3 ------------------------------------------------------------------------------
class FastShelfPlace(_TaskBase):
    """``SawyerShelfPlaceEnvV3`` (its object position is ``get_body_com``, already on the fast path)."""

    _target_pos: np.ndarray
    obj_init_pos: np.ndarray

    def _get_quat_objects(self) -> np.ndarray:
        return _geom_quat(self, "objGeom")

    def compute_reward(self, action: np.ndarray, obs: np.ndarray) -> tuple[float, float, float, float, float, float]:
        if not _v2_ready(self):
            return plain(self).compute_reward(action, obs)  # type: ignore[no-any-return]
        target_radius = 0.05
        hamacher = self._fast_reward_utils.hamacher_product
        tcp = self.tcp_center  # type: ignore[attr-defined]
        obj = obs[4:7]
        tcp_opened = obs[3]
        target = self._target_pos
        obj_to_target = float(norm(obj - target))
        tcp_to_obj = float(norm(obj - tcp))
        in_place_margin = norm(self.obj_init_pos - target)
        in_place = self._fast_reward_utils.tolerance(obj_to_target, bounds=(0, target_radius), margin=in_place_margin, sigmoid="long_tail")
        object_grasped = self._gripper_caging_reward(  # type: ignore[attr-defined]
            action=action, obj_pos=obj, obj_radius=0.02, pad_success_thresh=0.05, object_reach_radius=0.01,
            xz_thresh=0.01, high_density=False,
        )  # fmt: skip
        reward = hamacher(object_grasped, in_place)
        below_shelf = 0.0 < obj[2] < 0.24 and (target[0] - 0.15 < obj[0] < target[0] + 0.15)
        if below_shelf and ((target[1] - 3 * target_radius) < obj[1] < target[1]):
            z_scaling = (0.24 - obj[2]) / 0.24
            y_scaling = (obj[1] - (target[1] - 3 * target_radius)) / (3 * target_radius)
            bound_loss = hamacher(y_scaling, z_scaling)
            in_place = np.clip(in_place - bound_loss, 0.0, 1.0)
        if below_shelf and (obj[1] > target[1]):
            in_place = 0.0
        if tcp_to_obj < 0.025 and (tcp_opened > 0) and (obj[2] - 0.01 > self.obj_init_pos[2]):
            reward += 1.0 + 5.0 * in_place
        if obj_to_target < target_radius:
            reward = 10.0
        return reward, tcp_to_obj, tcp_opened, obj_to_target, object_grasped, in_place


# ---- peg-unplug-side-v3 --------------------------------------------------------------------------
class FastPegUnplugSide(_TaskBase):
    """``SawyerPegUnplugSideEnvV3`` (its object position is ``_get_site_pos``, already on the fast
    path)."""

    _target_pos: np.ndarray
    obj_init_pos: np.ndarray

    def _get_quat_objects(self) -> np.ndarray:
        plug = self._fast_ids.lookup("body", "plug1")
        if plug < 0:
            return plain(self)._get_quat_objects()  # type: ignore[no-any-return]
        return self.data.xquat[plug]  # type: ignore[no-any-return]  (a view, as MetaWorld's)

    def compute_reward(self, action: np.ndarray, obs: np.ndarray) -> tuple[float, float, float, float, float, float, float]:
        if not _v2_ready(self):
            return plain(self).compute_reward(action, obs)  # type: ignore[no-any-return]
        tcp = self.tcp_center  # type: ignore[attr-defined]
        obj = obs[4:7]
        tcp_opened = obs[3]
        target = self._target_pos
        tcp_to_obj = float(norm(obj - tcp))
        obj_to_target = float(norm(obj - target))
        object_grasped = self._gripper_caging_reward(  # type: ignore[attr-defined]
            action, obj, object_reach_radius=0.01, obj_radius=0.025, pad_success_thresh=0.05, xz_thresh=0.005,
            desired_gripper_effort=0.8, high_density=True,
        )  # fmt: skip
        in_place_margin = float(norm(self.obj_init_pos - target))
        in_place = self._fast_reward_utils.tolerance(obj_to_target, bounds=(0, 0.05), margin=in_place_margin, sigmoid="long_tail")
        grasp_success = tcp_opened > 0.5 and (obj[0] - self.obj_init_pos[0] > 0.015)
        reward = 2 * object_grasped
        if grasp_success and tcp_to_obj < 0.035:
            reward = 1 + 2 * object_grasped + 5 * in_place
        if obj_to_target <= 0.05:
            reward = 10.0
        return reward, tcp_to_obj, tcp_opened, obj_to_target, object_grasped, in_place, float(grasp_success)


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
