"""HumanoidBench's real H1 envs (skipped where the package is absent; CI installs it): spaces,
success on the return, and a two-task CRL run whose VecNormalize statistics carry across the task
switch and across a resume."""

from __future__ import annotations

import importlib.util
import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from rl_moe.crl import main
from rl_moe.envs.factories import EnvFactory
from rl_moe.envs.suite_spec import TaskSpec
from rl_moe.envs.suites import load_suite
from rl_moe.rundir import RunDir

pytestmark = pytest.mark.skipif(importlib.util.find_spec("humanoid_bench") is None, reason="HumanoidBench not installed")


@pytest.mark.parametrize("index", range(6))
def test_each_h1_task_has_the_papers_spaces(index: int) -> None:
    suite = load_suite("hb5")
    task = (*suite.tasks, *suite.probe_tasks)[index]
    env = EnvFactory(suite.family, task, suite.episode_length, suite.success_type, seed=0)()
    try:
        obs, _ = env.reset()
        assert obs.shape == (51,) and env.action_space.shape == (19,), task.name
        _, reward, terminated, truncated, info = env.step(env.action_space.sample())
        assert np.isfinite(reward) and type(terminated) is bool and type(truncated) is bool and "is_success" in info
    finally:
        env.close()


def test_success_is_the_return_against_the_tasks_bar() -> None:
    suite = load_suite("hb5")
    walk = suite.tasks[1]
    probe = EnvFactory(suite.family, walk, suite.episode_length, suite.success_type, seed=3)()
    probe.reset()
    rewards = [float(probe.step(np.zeros(19, dtype=np.float32))[1]) for _ in range(20)]
    probe.close()
    bar = float(np.cumsum(rewards)[9]) + 1e-9  # crossed after the 11th step, not before
    env = EnvFactory(suite.family, TaskSpec(walk.name, success_bar=bar), suite.episode_length, suite.success_type, seed=3)()
    env.reset()
    flags = [bool(env.step(np.zeros(19, dtype=np.float32))[4]["is_success"]) for _ in range(20)]
    env.close()
    assert flags == [total >= bar for total in np.cumsum(rewards)]
    assert flags[:10] == [False] * 10 and all(flags[10:])


def _vecnormalize(run: Path, i: int, name: str):
    with open(RunDir.vecnormalize(RunDir(run).checkpoint(i, name)), "rb") as fh:
        return pickle.load(fh)


def test_two_task_crl_run_carries_vecnormalize_across_the_switch_and_a_resume(tmp_path: Path, stop_before_task) -> None:
    argv = ["--suite", "hb5", "--method", "topk", "--tasks", "2", "--steps-per-task", "1024", "--preset", "tiny", "--no-progress", "--set", "eval.n_episodes=1", "--set", "eval.matrix_episodes=1"]
    full = tmp_path / "full"
    assert main([*argv, "--run-dir", str(full)]) == 0
    names = load_suite("hb5").task_names
    first, second = _vecnormalize(full, 0, names[0]), _vecnormalize(full, 1, names[1])
    # The second task's statistics continue the first's: its count includes the first task's steps.
    assert second.obs_rms.count > first.obs_rms.count > 1000
    cut = tmp_path / "cut"
    assert stop_before_task([*argv, "--run-dir", str(cut)], 1) == 130
    assert main(["--resume", str(cut), "--no-progress"]) == 0
    resumed = _vecnormalize(cut, 1, names[1])
    np.testing.assert_array_equal(resumed.obs_rms.mean, second.obs_rms.mean)
    np.testing.assert_array_equal(resumed.obs_rms.var, second.obs_rms.var)
    res_full, res_cut = (json.loads((p / "results.json").read_text()) for p in (full, cut))
    assert res_cut["success_matrix"] == res_full["success_matrix"] and res_cut["eval_curves"] == res_full["eval_curves"]
