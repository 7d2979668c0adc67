"""The fast path's methods for CW10's stick-pull, shelf-place and peg-unplug-side, bit for bit
MetaWorld's (the rules of :mod:`rl_moe.envs.metaworld_fast_tasks`, whose :data:`TASKS` lists them)."""

from __future__ import annotations

import numpy as np

from rl_moe.envs.metaworld_fast_base import TaskBase, geom_quat, plain, v2_ready
from rl_moe.envs.metaworld_fast_math import norm, quat_from_matrix


# ---- stick-pull-v3 -------------------------------------------------------------------------------
_CONTAINER_OFFSET = np.array([0.05, 0.0, 0.0])
_YZ_SCALING = np.array([1.0, 1.0, 2.0])
_NO_QUAT = np.array([0.0, 0.0, 0.0, 0.0])


class FastStickPull(TaskBase):
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
        if not v2_ready(self):
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
class FastShelfPlace(TaskBase):
    """``SawyerShelfPlaceEnvV3`` (its object position is ``get_body_com``, already on the fast path)."""

    _target_pos: np.ndarray
    obj_init_pos: np.ndarray

    def _get_quat_objects(self) -> np.ndarray:
        return geom_quat(self, "objGeom")

    def compute_reward(self, action: np.ndarray, obs: np.ndarray) -> tuple[float, float, float, float, float, float]:
        if not v2_ready(self):
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
class FastPegUnplugSide(TaskBase):
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
        if not v2_ready(self):
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
