"""Loading a task's checkpoint with the env the run used (rl_moe.continual.checkpoints)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from stable_baselines3.common.save_util import load_from_zip_file

from rl_moe.continual.checkpoints import load_checkpoint, make_task_env
from rl_moe.continual.resolve import RunRequest, resolve
from rl_moe.crl import main
from rl_moe.errors import UsageError
from rl_moe.rundir import RunDir


def test_cw10_task_env_has_the_suites_episode_rules(tmp_path: Path) -> None:
    # CW10's env: 200-step episodes (MT1 has 500), a fresh goal at each reset, success in the info.
    cfg = resolve(RunRequest(suite="cw10-cw", tasks=2, device="cpu"))
    cfg.save(str(RunDir(tmp_path).config))
    env = make_task_env(tmp_path, "push-wall-v3", seed=3)
    goals = []
    for _ in range(2):
        obs, _ = env.reset()
        goals.append(obs[-3:].copy())
        for t in range(1, 501):
            obs, _, terminated, truncated, info = env.step(env.action_space.sample())
            assert "is_success" in info
            if terminated or truncated:
                break
        assert truncated and not terminated and t == 200
    assert not np.allclose(goals[0], goals[1])
    env.close()
    with pytest.raises(UsageError, match="valid choices: hammer-v3, push-wall-v3"):
        make_task_env(tmp_path, "faucet-close-v3")
    with pytest.raises(UsageError, match="no checkpoint for task 0"):
        load_checkpoint(tmp_path, 0)


def test_load_checkpoint_restores_the_saved_policy(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert main(["--suite", "smoke", "--method", "topk", "--tasks", "1", "--steps-per-task", "128", "--run-dir", str(run), "--preset", "tiny", "--no-progress"]) == 0
    model = load_checkpoint(run, "pendulum-0")
    _, params, _ = load_from_zip_file(str(RunDir(run).checkpoint(0, "pendulum-0")))
    for name, value in model.policy.state_dict().items():
        torch.testing.assert_close(value, params["policy"][name], rtol=0, atol=0)
    env = make_task_env(run, 0)
    obs, _ = env.reset(seed=0)
    action, _ = model.predict(obs, deterministic=True)
    assert env.action_space.shape == action.shape
    with pytest.raises(UsageError, match="out of range"):
        make_task_env(run, 5)
