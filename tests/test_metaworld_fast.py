"""The MetaWorld fast path (rl_moe.envs.metaworld_fast) against the plain official envs: the same
bytes on every CW10 and probe task, its pieces against their originals, its switches, and a short
``cw10-paper`` run that trains to the same weights on both paths."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import mujoco
import numpy as np
import pytest
import torch
from metaworld.utils import reward_utils
from scipy.spatial.transform import Rotation

from rl_moe.envs import metaworld_fast, metaworld_fast_math
from rl_moe.envs.envstate import restore_env, snapshot_env
from rl_moe.envs.factories import EnvFactory
from rl_moe.envs.families import METAWORLD_FAST_VAR, metaworld_expert
from rl_moe.envs.suite_spec import TaskSpec
from rl_moe.envs.suites import load_suite
from tests.test_intask import _params

PAPER = load_suite("cw10")
TASKS = [t.name for t in (*PAPER.tasks, *PAPER.probe_tasks)]


def _env(task: str, positions: str, length: int, fast: bool, monkeypatch: pytest.MonkeyPatch, seed: int = 3) -> Any:
    monkeypatch.setenv(METAWORLD_FAST_VAR, "1" if fast else "0")
    env = EnvFactory("metaworld", TaskSpec(task, params={"position_rule": positions}), length, "info", seed)()
    assert metaworld_fast.is_fast(env) == fast
    return env


def _trajectory(env: Any, task: str, steps: int, seed: int = 0) -> list[Any]:
    """Everything the env returns over ``steps`` steps with resets: 100 random actions, then 100
    of the scripted policy with noise, and so on (the policy grasps, so contacts and grasp terms
    are exercised)."""
    rng = np.random.default_rng(seed)
    expert = metaworld_expert(task)
    obs, _ = env.reset()
    out: list[Any] = [obs.tobytes()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the scripted policies warn that actions are clipped
        for t in range(steps):
            if (t // 100) % 2 == 0:
                action = rng.uniform(-1, 1, 4)
            else:
                action = np.clip(expert.get_action(obs) + 0.1 * rng.normal(size=4), -1, 1)
            obs, reward, terminated, truncated, info = env.step(action.astype(np.float32))
            infos = sorted((k, repr(v), type(v).__name__) for k, v in info.items() if k != "episode")
            out.append((obs.tobytes(), str(obs.dtype), repr(reward), type(reward).__name__, terminated, truncated, infos))
            if terminated or truncated:
                obs, _ = env.reset()
                out.append(obs.tobytes())
    return out


def _same_trajectories(task: str, positions: str, length: int, steps: int, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = _trajectory(_env(task, positions, length, False, monkeypatch), task, steps)
    fast = _trajectory(_env(task, positions, length, True, monkeypatch), task, steps)
    first = next((i for i, (a, b) in enumerate(zip(plain, fast)) if a != b), None)
    assert first is None and len(plain) == len(fast), f"{task} {positions} {length}: first difference at entry {first}"
    assert sum(1 for e in plain if isinstance(e, bytes)) >= 2  # at least one reset inside


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("positions", ["fixed", "resample"])
def test_fast_path_is_bit_identical(task: str, positions: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _same_trajectories(task, positions, 200, 230, monkeypatch)


@pytest.mark.parametrize("task", ["push-wall-v3", "hammer-v3"])
def test_fast_path_is_bit_identical_over_500_step_episodes(task: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # 500 steps is also MetaWorld's own max_path_length: the truncation comes from the env itself.
    _same_trajectories(task, "fixed", 500, 520, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("positions", ["fixed", "resample"])
@pytest.mark.parametrize("length", [200, 500])
def test_fast_path_is_bit_identical_thorough(task: str, positions: str, length: int, monkeypatch: pytest.MonkeyPatch) -> None:
    _same_trajectories(task, positions, length, 2500, monkeypatch)


def _rotation_matrices(n: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Random rotations, near-identity ones and every axis-aligned one (ties in scipy's branch)."""
    out = []
    for i in range(n):
        q = rng.normal(size=4) if i % 2 else np.array([1.0, 0, 0, 0]) + 1e-3 * rng.normal(size=4)
        m = np.empty(9)
        mujoco.mju_quat2Mat(m, q / np.linalg.norm(q))
        out.append(m.reshape(3, 3))
    for axis in np.eye(3):
        for angle in (0.0, np.pi / 2, np.pi, -np.pi / 2):
            out.append(Rotation.from_rotvec(axis * angle).as_matrix())
    return out


def test_quaternion_matches_scipy_bit_for_bit() -> None:
    for m in _rotation_matrices(20_000, np.random.default_rng(0)):
        assert metaworld_fast_math.quat_from_matrix(m).tobytes() == Rotation.from_matrix(m).as_quat().tobytes(), m


def test_quaternion_leaves_what_scipy_would_orthogonalize_or_refuse_to_scipy() -> None:
    skewed = np.diag([1.0, 1.0, 1.0 + 1e-4])  # not orthogonal: scipy orthogonalizes it by SVD
    assert metaworld_fast_math.quat_from_matrix(skewed).tobytes() == Rotation.from_matrix(skewed).as_quat().tobytes()
    with pytest.raises(ValueError, match="determinant"):
        metaworld_fast_math.quat_from_matrix(np.diag([1.0, 1.0, -1.0]))


@pytest.mark.parametrize("sigmoid", ["gaussian", "hyperbolic", "long_tail", "reciprocal", "cosine", "linear", "quadratic", "tanh_squared"])
def test_tolerance_matches_metaworld(sigmoid: str) -> None:
    fast = metaworld_fast_math.fast_tolerance(reward_utils.tolerance, reward_utils._sigmoids)
    rng = np.random.default_rng(1)
    for _ in range(3000):
        lower = float(rng.uniform(-1, 1))
        upper = lower + float(rng.choice([0.0, rng.uniform(0, 1)]))
        margin = rng.choice([0.0, float(rng.uniform(0, 2))])
        x = rng.uniform(-3, 3)
        for xv, mv in ((x, margin), (float(x), float(margin)), (np.float64(lower), margin), (x, np.float64(margin))):
            want = reward_utils.tolerance(xv, bounds=(lower, upper), margin=mv, sigmoid=sigmoid, value_at_margin=0.1)
            got = fast(xv, bounds=(lower, upper), margin=mv, sigmoid=sigmoid, value_at_margin=0.1)
            assert (repr(got), type(got)) == (repr(want), type(want)), (xv, lower, upper, mv)
    # arrays and float32 go to the original
    xs = rng.uniform(-3, 3, 5)
    assert np.array_equal(fast(xs, bounds=(0, 1), margin=0.5, sigmoid=sigmoid), reward_utils.tolerance(xs, bounds=(0, 1), margin=0.5, sigmoid=sigmoid))
    x32 = np.float32(1.7)
    assert repr(fast(x32, bounds=(0, 1), margin=0.5, sigmoid=sigmoid)) == repr(reward_utils.tolerance(x32, bounds=(0, 1), margin=0.5, sigmoid=sigmoid))
    with pytest.raises(ValueError, match="Lower bound"):
        fast(0.5, bounds=(1.0, 0.0), margin=0.1, sigmoid=sigmoid)


def test_norm_and_clip_match_numpy_bit_for_bit() -> None:
    rng = np.random.default_rng(4)
    cases: list[Any] = [rng.normal(size=n) for n in (2, 3, 4, 9)]
    cases += [rng.normal(size=(3, 3)), rng.normal(size=8)[::2], np.array([3, 4]), [0.1, 0.2, 0.3], np.float32([1e-3, 2.0, 3.0])]
    for x in cases:
        want, got = np.linalg.norm(x), metaworld_fast_math.norm(x)
        assert type(got) is type(want) and np.asarray(got).tobytes() == np.asarray(want).tobytes(), x
    obs, low, high = rng.normal(size=39), -np.abs(rng.normal(size=39)), np.abs(rng.normal(size=39))
    obs[:3] = [np.nan, -0.0, np.inf]
    low[1] = 0.0
    want = np.clip(obs, a_max=high, a_min=low, dtype=np.float64)
    assert metaworld_fast_math.clip(obs, low, high, dtype=np.float64).tobytes() == want.tobytes()
    for d in (np.float64(-0.3), np.float64(0.4), np.float64(12.0)):
        assert repr(metaworld_fast_math.clip(d, 0.0, 1.0)) == repr(np.clip(d, 0.0, 1.0))


@pytest.mark.parametrize("task", TASKS)
def test_main_object_id_is_metaworlds(task: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The id the fast path caches is the one MetaWorld looks up by name (or both raise alike)."""
    plain, fast = (_env(task, "fixed", 200, f, monkeypatch).unwrapped for f in (False, True))
    try:
        want: Any = plain._get_id_main_object()
    except Exception as e:  # noqa: BLE001  (some tasks name no main object; the fast path must raise alike)
        want = type(e)
    try:
        got: Any = fast._get_id_main_object()
    except Exception as e:  # noqa: BLE001
        got = type(e)
    assert got == want


def test_task_methods_go_where_the_task_class_still_uses_its_own() -> None:
    """Each entry of TASKS names a MetaWorld class whose env gets its methods; a subclass that
    defines its own ``compute_reward`` keeps it, and takes the task's other methods."""
    import importlib

    from rl_moe.envs.metaworld_fast_tasks import TASKS as TASK_METHODS

    for qualified, methods in TASK_METHODS.items():
        module, name = qualified.rsplit(".", 1)
        task_cls = getattr(importlib.import_module(module), name)
        fast = metaworld_fast.fast_class(task_cls)
        assert fast._fast_task is task_cls
        own = [m for m in vars(methods) if not m.startswith("__")]
        assert own and all(vars(fast)[m] is vars(methods)[m] for m in own), qualified

        def compute_reward(self: Any, action: Any, obs: Any) -> Any:
            raise NotImplementedError

        custom = metaworld_fast.fast_class(type(f"Custom{name}", (task_cls,), {"compute_reward": compute_reward}))
        assert "compute_reward" not in vars(custom) and custom.compute_reward is compute_reward
        assert all(vars(custom)[m] is vars(methods)[m] for m in own if m != "compute_reward")


def test_other_metaworld_versions_get_the_plain_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metaworld_fast.importlib.metadata, "version", lambda name: "3.0.0")
    reason = metaworld_fast.unsupported_reason()
    assert reason is not None and "3.1.1" in reason and "3.0.0" in reason and "\n" not in reason
    env = EnvFactory("metaworld", TaskSpec("reach-v3"), 200, "info", 0)()
    assert not metaworld_fast.is_fast(env)


def test_the_switch_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert metaworld_fast.is_fast(_env("reach-v3", "fixed", 200, True, monkeypatch))
    assert not metaworld_fast.is_fast(_env("reach-v3", "fixed", 200, False, monkeypatch))


def test_a_snapshot_moves_between_the_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """An in-task checkpoint of a plain-path run resumes on the fast path with the same numbers:
    the snapshots hold the same attributes, and the restored fast env steps on as the plain one."""
    plain = _env("push-wall-v3", "fixed", 500, False, monkeypatch)
    fast = _env("push-wall-v3", "fixed", 500, True, monkeypatch)
    rng = np.random.default_rng(2)
    plain.reset()
    fast.reset()
    for a in rng.uniform(-1, 1, (150, 4)):
        plain.step(a)
    saved = snapshot_env(plain)
    assert [sorted(layer) for layer in saved] == [sorted(layer) for layer in snapshot_env(fast)]
    restore_env(fast, saved)
    for a in rng.uniform(-1, 1, (100, 4)):
        op, rp, *_ = plain.step(a)
        of, rf, *_ = fast.step(a)
        assert op.tobytes() == of.tobytes() and repr(rp) == repr(rf)


def test_a_short_cw10_paper_run_trains_the_same_weights_on_both_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rl_moe.crl import main

    argv = ["--suite", "cw10", "--method", "sphere", "--tasks", "2", "--steps-per-task", "256", "--preset", "tiny",
            "--vec-env", "dummy", "--no-progress", "--set", "eval.evals_per_task=1", "--set", "eval.n_episodes=1",
            "--set", "eval.matrix_episodes=1", "--set", "eval.n_envs=1"]  # fmt: skip
    runs = {}
    for fast in ("0", "1"):
        monkeypatch.setenv(METAWORLD_FAST_VAR, fast)
        runs[fast] = tmp_path / f"fast{fast}"
        assert main([*argv, "--run-dir", str(runs[fast])]) == 0
    a, b = _params(runs["0"]), _params(runs["1"])
    assert len(a) == 2 and a.keys() == b.keys()
    for name in a:
        for key in a[name]:
            assert torch.equal(a[name][key], b[name][key]), (name, key)
    ra, rb = (json.loads((runs[f] / "results.json").read_text()) for f in ("0", "1"))
    assert ra["eval_curves"] == rb["eval_curves"] and ra["success_matrix"] == rb["success_matrix"]
