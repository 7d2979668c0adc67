"""The bounded-mean Top-K (``--method topk_bounded``): PPO's Gaussian mean tanh-bounded to the
action box, with the Gaussian log-probability unchanged (rl_moe.policies.ppo.BoundedMean)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces
from stable_baselines3 import PPO

from rl_moe.crl import main
from rl_moe.diagnostics.action_box import mean_outside_box
from rl_moe.policies import MoEActorCriticPolicy
from tests.conftest import NETS

TINY = {"moe": "topk", **NETS["tiny"]}
OBS = spaces.Box(-np.inf, np.inf, (5,), np.float32)


def _policy(action_space: spaces.Box, bounded: bool = True) -> MoEActorCriticPolicy:
    torch.manual_seed(0)
    return MoEActorCriticPolicy(OBS, action_space, lambda _: 1e-3, bounded_mean=bounded, **TINY)


def _push_means_out(policy: MoEActorCriticPolicy, size: float) -> None:
    with torch.no_grad():
        for p in policy.actor_net.parameters():
            p.mul_(size)


def test_the_mean_never_leaves_the_box() -> None:
    box = spaces.Box(np.array([-2.0, 0.0, -1.0]), np.array([2.0, 1.0, 1.0]), dtype=np.float32)
    obs = torch.randn(256, 5) * 10
    bounded, free = _policy(box), _policy(box, bounded=False)
    for p in (bounded, free):
        _push_means_out(p, 50.0)
    assert mean_outside_box(free, obs, box) > 0.3  # the same network, unbounded, leaves the box
    assert mean_outside_box(bounded, obs, box) == 0.0
    mode = bounded.get_distribution(obs).mode()
    assert torch.all(mode >= torch.tensor(box.low)) and torch.all(mode <= torch.tensor(box.high))


def test_the_log_probability_is_the_gaussians_around_the_bounded_mean() -> None:
    box = spaces.Box(-1.0, 1.0, (4,), np.float32)
    policy = _policy(box)
    _push_means_out(policy, 20.0)
    obs = torch.randn(64, 5)
    actions = torch.rand(64, 4) * 4 - 2  # samples may lie outside the box: they are Gaussian
    _, log_prob, entropy = policy.evaluate_actions(obs, actions)
    latent = policy.actor_net(policy.extract_features(obs)).out
    reference = torch.distributions.Normal(torch.tanh(latent), policy.log_std.exp())
    torch.testing.assert_close(log_prob, reference.log_prob(actions).sum(-1))
    torch.testing.assert_close(entropy, reference.entropy().sum(-1))


def test_the_setting_survives_save_and_load(tmp_path: Path) -> None:
    model = PPO(MoEActorCriticPolicy, "Pendulum-v1", n_steps=32, batch_size=32, policy_kwargs={"bounded_mean": True, **TINY})
    model.save(tmp_path / "m.zip")
    loaded = PPO.load(tmp_path / "m.zip")
    assert loaded.policy.bounded_mean and type(loaded.policy.action_net).__name__ == "BoundedMean"
    obs = torch.randn(8, 3)
    torch.testing.assert_close(loaded.policy.get_distribution(obs).mode(), model.policy.get_distribution(obs).mode())


def test_td3_has_no_gaussian_mean_to_bound(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert main(["--suite", "smoke", "--algo", "td3", "--method", "topk_bounded", "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "topk_bounded" in err[0] and "--algo ppo" in err[0]
    assert not run.exists()


def test_ppo_with_a_bounded_mean_learns_the_first_smoke_task(tmp_path: Path) -> None:
    run = tmp_path / "run"
    argv = ["--suite", "smoke", "--method", "topk_bounded", "--tasks", "1", "--steps-per-task", "20480", "--no-progress",
            "--run-dir", str(run), "--set", "probe.enabled=false", "--set", "eval.evals_per_task=4"]  # fmt: skip
    assert main(argv) == 0
    curve = json.loads((run / "results.json").read_text())["eval_curves"]["pendulum-0"]["return"]
    # Measured (seed 0): -1275 -> -926 over 20k steps (Top-K unbounded: -1275 -> -912). An actor that
    # does not learn stays near -1275.
    assert curve[-1] >= curve[0] + 0.15 * abs(curve[0]), curve
