"""A fast path for the official MetaWorld v3 envs: the same numbers from fewer Python steps.

MetaWorld's ``step`` spends most of its time in Python, not in MuJoCo (benchmarks/README.md, "Env
backends"): a list of contact objects built twice per step, scipy's ``Rotation.from_matrix`` on
one 3x3 matrix, named MuJoCo accessors looked up on every call, and numpy's array machinery on
scalars. :func:`make_fast` puts a subclass over a built env that replaces those spots with code
computing the same IEEE operations in the same order, so observations, rewards and ``info`` are
bit-identical (tests/test_metaworld_fast.py checks it on every CW10 and probe task).

What changes, and why each stays bit-identical:

- ``touching_object``: an array test over ``data.contact.geom`` picks the same contacts; their
  forces are still summed one by one in contact order, from the integer 0, as the original does.
- The object quaternion: scipy's matrix-to-quaternion branch (Markley's method, then division by
  the norm) written out on Python floats in scipy's operation order. Any matrix scipy would first
  orthogonalize, or whose determinant it would refuse, goes to scipy itself: the check here keeps
  a 10x margin inside scipy's tolerances, so the two checks cannot disagree.
- Body and site positions by cached ids (``data.xpos[id]`` is the array ``data.body(name).xpos``
  views), and the observation assembled into one preallocated array.
- ``reward_utils.tolerance`` on scalars: the bounds test and the distance on Python floats, then
  MetaWorld's own ``_sigmoids`` on the same ``numpy.float64`` it would have received.
- ``numpy.linalg.norm`` and ``numpy.clip`` as the ``dot``, ``sqrt`` and ``clip`` ufunc calls they
  end in (:mod:`~rl_moe.envs.metaworld_fast_math`).
- For the tasks in :data:`~rl_moe.envs.metaworld_fast_tasks.TASKS`, the task's own reward and
  object readings, written out the same way.

It is written against metaworld 3.1.1 only (:data:`SUPPORTED_VERSION`), with no import from the
rest of the package beyond its two companion modules, so that the three can be offered upstream as
they are. On any other version :func:`unsupported_reason` says why and :func:`make_fast` returns
the env unchanged.
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Callable
from typing import Any

import mujoco
import numpy as np

from rl_moe.envs.metaworld_fast_base import plain
from rl_moe.envs.metaworld_fast_math import ExactRotation, clip, fast_tolerance, norm
from rl_moe.envs.metaworld_fast_tasks import TASKS

#: The only metaworld release whose code this module mirrors.
SUPPORTED_VERSION = "3.1.1"
#: The mocap orientation MetaWorld writes at every step (the hand pointing down).
_MOCAP_QUAT = np.array([1, 0, 1, 0])
#: MuJoCo object types by the names used here.
_OBJ_TYPES = {
    "body": mujoco.mjtObj.mjOBJ_BODY, "site": mujoco.mjtObj.mjOBJ_SITE, "geom": mujoco.mjtObj.mjOBJ_GEOM,
    "joint": mujoco.mjtObj.mjOBJ_JOINT,
}  # fmt: skip
#: The x and z coordinates (MetaWorld's caging reward compares positions in that plane).
_XZ = [0, 2]


def unsupported_reason() -> str | None:
    """None where the fast path applies, else one line saying why not."""
    try:
        version = importlib.metadata.version("metaworld")
    except importlib.metadata.PackageNotFoundError:
        return "metaworld is not installed"
    if version != SUPPORTED_VERSION:
        return f"the MetaWorld fast path mirrors metaworld {SUPPORTED_VERSION}'s code; found {version}, so the plain envs run"
    return None


class _Swapped:
    """``module.name`` set to ``value`` inside the block, restored after it (also on an error). A
    class, not a generator: evaluate_state enters one on every step."""

    __slots__ = ("module", "name", "value", "saved")

    def __init__(self, module: Any, name: str, value: Any) -> None:
        self.module, self.name, self.value = module, name, value

    def __enter__(self) -> None:
        self.saved = getattr(self.module, self.name)
        setattr(self.module, self.name, self.value)

    def __exit__(self, *exc: object) -> None:
        setattr(self.module, self.name, self.saved)


# ---- the env subclass ----------------------------------------------------------------------------
class _Ids:
    """Ids looked up once per env (an object, not plain numbers, so env snapshots skip it)."""

    def __init__(self, env: Any) -> None:
        self._model = env.model
        self._cache: dict[tuple[str, str], int] = {}
        body, site, geom = (lambda name, kind=kind: self.lookup(kind, name) for kind in ("body", "site", "geom"))
        self.hand = body("hand")
        self.rightclaw, self.leftclaw = body("rightclaw"), body("leftclaw")
        self.leftpad, self.rightpad = body("leftpad"), body("rightpad")
        self.right_ee, self.left_ee = site("rightEndEffector"), site("leftEndEffector")
        self.leftpad_geom, self.rightpad_geom = geom("leftpad_geom"), geom("rightpad_geom")

    def lookup(self, kind: str, name: str) -> int:
        """The id of MuJoCo object ``name`` of ``kind`` (body, site, geom, joint), -1 if there is none."""
        key = (kind, name)
        if key not in self._cache:
            self._cache[key] = int(mujoco.mj_name2id(self._model, _OBJ_TYPES[kind], name))
        return self._cache[key]


class FastSawyerMixin:
    """The overrides. :func:`fast_class` copies them into a one-base subclass of the env's class:
    CPython refuses to swap an object's ``__class__`` for a class with a second base."""

    data: Any
    _fast_ids: _Ids
    _fast_module: Any
    _fast_reward_utils: Any
    _fast_tolerance: Callable[..., Any]
    _obs_obj_max_len: int

    def get_endeff_pos(self) -> np.ndarray:
        return self.data.xpos[self._fast_ids.hand]

    @property
    def tcp_center(self) -> np.ndarray:
        ids = self._fast_ids
        xpos = self.data.site_xpos
        return (xpos[ids.right_ee] + xpos[ids.left_ee]) / 2.0

    def get_body_com(self, body_name: str) -> np.ndarray:
        i = self._fast_ids.lookup("body", body_name)
        if i < 0:
            return plain(self).get_body_com(body_name)  # type: ignore[misc]  (raises as MetaWorld does)
        return self.data.xpos[i]

    def _get_site_pos(self, site_name: str) -> np.ndarray:
        i = self._fast_ids.lookup("site", site_name)
        if i < 0:
            return plain(self)._get_site_pos(site_name)  # type: ignore[misc]
        return self.data.site_xpos[i].copy()

    def touching_object(self, object_geom_id: int) -> bool:
        data = self.data
        if data.ncon == 0:
            return False
        ids = self._fast_ids
        left_pad, right_pad = ids.leftpad_geom, ids.rightpad_geom
        force = data.efc_force
        # Each pad's forces summed one by one in contact order from the integer 0, as the
        # original's sum() over its list of contacts does.
        left = right = 0
        for (g1, g2), address in zip(data.contact.geom.tolist(), data.contact.efc_address.tolist()):
            if g1 == object_geom_id or g2 == object_geom_id:
                if g1 == left_pad or g2 == left_pad:
                    left = left + force[address]
                if g1 == right_pad or g2 == right_pad:
                    right = right + force[address]
        return 0 < left and 0 < right

    def _set_pos_site(self, name: str, pos: np.ndarray) -> None:
        assert isinstance(pos, np.ndarray)
        assert pos.ndim == 1
        i = self._fast_ids.lookup("site", name)
        if i < 0:
            return plain(self)._set_pos_site(name, pos)  # type: ignore[misc]
        self.data.site_xpos[i] = pos[:3]

    def _gripper_caging_reward(
        self, action: np.ndarray, obj_pos: np.ndarray, obj_radius: float, pad_success_thresh: float, object_reach_radius: float,
        xz_thresh: float, desired_gripper_effort: float = 1.0, high_density: bool = False, medium_density: bool = False,
    ) -> float:  # fmt: skip
        """MetaWorld's caging reward with its two-element arrays as scalars (same operations)."""
        init = self.obj_init_pos  # type: ignore[attr-defined]
        plain_arrays = all(isinstance(a, np.ndarray) and a.dtype == np.float64 for a in (obj_pos, init))
        if (high_density and medium_density) or not plain_arrays:
            return plain(self)._gripper_caging_reward(  # type: ignore[misc]
                action, obj_pos, obj_radius, pad_success_thresh, object_reach_radius, xz_thresh,
                desired_gripper_effort, high_density, medium_density,
            )  # fmt: skip
        tolerance, hamacher = self._fast_tolerance, self._fast_reward_utils.hamacher_product
        xpos, ids = self.data.xpos, self._fast_ids
        pad_y = (xpos[ids.leftpad][1], xpos[ids.rightpad][1])
        caging_lr = [
            tolerance(abs(y - obj_pos[1]), bounds=(obj_radius, pad_success_thresh), margin=abs(abs(y - init[1]) - pad_success_thresh), sigmoid="long_tail")
            for y in pad_y
        ]  # fmt: skip
        caging_y = hamacher(*caging_lr)
        tcp = self.tcp_center
        to_init = init[_XZ] - self.init_tcp[_XZ]  # type: ignore[attr-defined]
        caging_xz_margin = norm(to_init)
        caging_xz_margin -= xz_thresh
        to_obj = tcp[_XZ] - obj_pos[_XZ]
        caging_xz = tolerance(norm(to_obj), bounds=(0, xz_thresh), margin=caging_xz_margin, sigmoid="long_tail")
        gripper_closed = min(max(0, action[-1]), desired_gripper_effort) / desired_gripper_effort
        caging = hamacher(caging_y, float(caging_xz))
        gripping = gripper_closed if caging > 0.97 else 0.0
        caging_and_gripping = hamacher(caging, gripping)
        if high_density:
            caging_and_gripping = (caging_and_gripping + caging) / 2
        if medium_density:
            tcp = self.tcp_center
            to_obj = obj_pos - tcp
            to_obj_init = init - self.init_tcp  # type: ignore[attr-defined]
            reach_margin = abs(norm(to_obj_init) - object_reach_radius)
            reach = tolerance(norm(to_obj), bounds=(0, object_reach_radius), margin=reach_margin, sigmoid="long_tail")
            caging_and_gripping = (caging_and_gripping + float(reach)) / 2
        return caging_and_gripping

    def set_xyz_action(self, action: np.ndarray) -> None:
        # np.clip(a, lo, hi) is minimum(maximum(a, lo), hi), NaN included, without its Python layers.
        action = np.minimum(np.maximum(action, -1), 1)
        pos_delta = action * self.action_scale  # type: ignore[attr-defined]
        new_mocap_pos = self.data.mocap_pos + pos_delta[None]
        new_mocap_pos[0, :] = np.minimum(np.maximum(new_mocap_pos[0, :], self.mocap_low), self.mocap_high)  # type: ignore[attr-defined]
        self.data.mocap_pos = new_mocap_pos
        self.data.mocap_quat = _MOCAP_QUAT

    def step(self, action: np.ndarray) -> tuple[np.ndarray, Any, bool, bool, dict[str, Any]]:
        """SawyerXYZEnv.step with its calls inlined (MetaWorld's own checks and messages kept)."""
        # metaworld 3.1.1 never sets _did_see_sim_exception during a step, so checking it here
        # decides the step as MetaWorld's own check after the simulation would.
        if not self._set_task_called or self._did_see_sim_exception:  # type: ignore[attr-defined]
            return plain(self).step(action)  # type: ignore[misc]  (raises, or MetaWorld's unstable-sim reply)
        assert len(action) == 4, f"Actions should be size 4, got {len(action)}"
        self.set_xyz_action(action[:3])
        if self.curr_path_length >= self.max_path_length:  # type: ignore[attr-defined]
            raise ValueError("You must reset the env manually once truncate==True")
        self.do_simulation([action[-1], -action[-1]], n_frames=self.frame_skip)  # type: ignore[attr-defined]
        self.curr_path_length += 1  # type: ignore[attr-defined]
        for site in self._target_site_config:  # type: ignore[attr-defined]
            self._set_pos_site(*site)
        mujoco.mj_forward(self.model, self.data)  # type: ignore[attr-defined]
        space = self.sawyer_observation_space  # type: ignore[attr-defined]
        obs = clip(self._get_obs(), space.low, space.high, dtype=np.float64)
        self._last_stable_obs = obs
        reward, info = self.evaluate_state(obs, action)
        truncate = self.curr_path_length == self.max_path_length  # type: ignore[attr-defined]
        return np.array(obs, dtype=np.float64), reward, False, truncate, info

    def _get_quat_objects(self) -> np.ndarray:
        module = self._fast_module
        if getattr(module, "Rotation", None) is None:
            return plain(self)._get_quat_objects()  # type: ignore[misc]
        with _Swapped(module, "Rotation", ExactRotation):
            return plain(self)._get_quat_objects()  # type: ignore[misc]

    def _get_curr_obs_combined_no_goal(self) -> np.ndarray:
        data, ids = self.data, self._fast_ids
        obj_pos = self._get_pos_objects()  # type: ignore[attr-defined]
        obj_quat = self._get_quat_objects()
        n_obj = len(obj_pos) // 3
        if len(obj_pos) % 3 or len(obj_quat) != 4 * n_obj or 7 * n_obj > self._obs_obj_max_len:
            return plain(self)._get_curr_obs_combined_no_goal()  # type: ignore[misc]  (raises as MetaWorld does)
        out = np.zeros(4 + self._obs_obj_max_len)
        out[0:3] = data.xpos[ids.hand]
        apart = data.xpos[ids.rightclaw] - data.xpos[ids.leftclaw]
        distance = norm(apart)
        out[3] = clip(distance / 0.1, 0.0, 1.0)
        for k in range(n_obj):
            out[4 + 7 * k : 7 + 7 * k] = obj_pos[3 * k : 3 * k + 3]
            out[7 + 7 * k : 11 + 7 * k] = obj_quat[4 * k : 4 * k + 4]
        return out

    def _get_obs(self) -> np.ndarray:
        pos_goal = self._get_pos_goal()  # type: ignore[attr-defined]
        if self._partially_observable:  # type: ignore[attr-defined]
            pos_goal = np.zeros_like(pos_goal)
        current = self._get_curr_obs_combined_no_goal()
        obs = np.concatenate((current, self._prev_obs, pos_goal))  # type: ignore[has-type]
        self._prev_obs = current
        return obs

    def _get_id_main_object(self) -> int:
        i = self._fast_ids.lookup("geom", "objGeom")
        if i < 0:
            return plain(self)._get_id_main_object()  # type: ignore[no-any-return]  (raises as MetaWorld does)
        return i

    def evaluate_state(self, obs: np.ndarray, action: np.ndarray) -> tuple[float, dict[str, Any]]:
        with _Swapped(self._fast_reward_utils, "tolerance", self._fast_tolerance):
            return plain(self).evaluate_state(obs, action)  # type: ignore[misc]


_FAST_CLASSES: dict[type, type] = {}


#: Overrides that wrap the env's own method (always safe: they call it).
_WRAPPERS = frozenset({"_get_quat_objects", "evaluate_state"})


def fast_class(cls: type) -> type:
    """The fast subclass of a MetaWorld env class (one per class, made once). A replacement goes
    in only where the class still uses MetaWorld's (or gymnasium's) shared version of the method:
    a task that defines its own ``_gripper_caging_reward``, say, keeps it. Likewise a task's own
    methods (:data:`~rl_moe.envs.metaworld_fast_tasks.TASKS`) go in only where the class still uses
    that task class's version."""
    if cls not in _FAST_CLASSES:
        # lazy: this module imports without metaworld (unsupported_reason reports it missing)
        from gymnasium.envs.mujoco import MujocoEnv
        from metaworld.sawyer_xyz_env import SawyerMocapBase, SawyerXYZEnv  # lazy: as above

        def owner(name: str) -> type | None:
            return next((k for k in cls.__mro__ if name in vars(k)), None)

        shared = (SawyerXYZEnv, SawyerMocapBase, MujocoEnv)
        overrides: dict[str, Any] = {name: value for name, value in _own(FastSawyerMixin) if name in _WRAPPERS or owner(name) in shared}
        task = next((k for k in cls.__mro__ if f"{k.__module__}.{k.__qualname__}" in TASKS), None)
        if task is not None:
            task_methods = TASKS[f"{task.__module__}.{task.__qualname__}"]
            overrides.update((name, value) for name, value in _own(task_methods) if owner(name) is task)
            overrides["_fast_task"] = task
        _FAST_CLASSES[cls] = type(f"Fast{cls.__name__}", (cls,), {**overrides, "__module__": __name__, "__slots__": ()})
    return _FAST_CLASSES[cls]


def _own(mixin: type) -> list[tuple[str, Any]]:
    """The methods a mixin class defines itself (no dunders)."""
    return [(name, value) for name, value in vars(mixin).items() if not name.startswith("__")]


def is_fast(env: Any) -> bool:
    """Whether ``env`` (or the env inside its wrappers) runs on the fast path."""
    return type(getattr(env, "unwrapped", env)) in _FAST_CLASSES.values()


def make_fast(env: Any) -> Any:
    """Put the fast path under a built MetaWorld v3 env (its ``unwrapped`` object) and return
    ``env``; unchanged where :func:`unsupported_reason` gives a reason or it is not a Sawyer env."""
    # lazy: this module imports without metaworld (unsupported_reason reports it missing)
    from metaworld.sawyer_xyz_env import SawyerXYZEnv
    from metaworld.utils import reward_utils  # lazy: as above

    raw = env.unwrapped
    if unsupported_reason() is not None or not isinstance(raw, SawyerXYZEnv) or is_fast(raw):
        return env
    # The module whose ``Rotation`` the env's quaternion reads: where ``_get_quat_objects`` is
    # defined (the goal-observable classes themselves live in metaworld.env_dict).
    owner = next(k for k in type(raw).__mro__ if "_get_quat_objects" in vars(k))
    module = sys.modules[owner.__module__]
    raw._fast_ids = _Ids(raw)
    raw._fast_module = module
    raw._fast_reward_utils = reward_utils
    raw._fast_tolerance = fast_tolerance(reward_utils.tolerance, reward_utils._sigmoids)
    raw.__class__ = fast_class(type(raw))
    return env
