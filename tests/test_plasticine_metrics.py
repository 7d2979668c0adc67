"""The Plasticine benchmark's three metrics beside ours: active units, the singular-value effective
rank of the features, and the relative weight change per update (known answers)."""

from __future__ import annotations

import math
import types

import pytest
import torch
from stable_baselines3.common.env_util import make_vec_env

from rl_moe.algos import MoEPPO
from rl_moe.algos.update import weight_change
from rl_moe.diagnostics.features import dormant_metrics, feature_metrics
from rl_moe.nn import NetConfig, build_network


def _features(phi: torch.Tensor) -> dict[str, float]:
    return feature_metrics(types.SimpleNamespace(phi=lambda layer, weighted: phi))  # only phi() is read


def test_feature_erank_of_orthonormal_and_rank_one_features() -> None:
    q, _ = torch.linalg.qr(torch.randn(64, 6, dtype=torch.float64))  # orthonormal columns
    assert _features(q)["feature_erank"] == pytest.approx(6.0)
    rank_one = torch.randn(64, 1) @ torch.randn(1, 6)
    assert _features(rank_one)["feature_erank"] == pytest.approx(1.0, abs=1e-6)


def test_feature_erank_uses_singular_values_not_gram_eigenvalues() -> None:
    phi = torch.zeros(4, 2, dtype=torch.float64)
    phi[0, 0], phi[1, 1] = 3.0, 1.0  # singular values 3 and 1
    entropy = lambda p: -sum(x * math.log(x) for x in p)  # noqa: E731
    got = _features(phi)
    assert got["feature_erank"] == pytest.approx(math.exp(entropy([0.75, 0.25])))
    assert got["feature_rank"] == pytest.approx(math.exp(entropy([0.9, 0.1])))  # ours: eigenvalues 9 and 1


def test_active_units_count_units_active_on_some_state() -> None:
    torch.manual_seed(0)
    net = build_network(5, 2, NetConfig(kind="mlp", hidden=(8, 8)))
    x = torch.randn(256, 5)
    with torch.no_grad():
        base = dormant_metrics(net(x))
        assert base["active_units"] == pytest.approx(1.0 - base["dormant_ratio_tau0"])
        alive_before = round(base["active_units"] * 16)
        live = [k for k in range(8) if net(x).groups[0].expert.hidden[0][:, k].abs().sum() > 0]
        net.experts.biases[0][0, live[0]] = -1e6  # this unit is never active now
        after = dormant_metrics(net(x))
    assert round(after["active_units"] * 16) <= alive_before - 1
    assert after["dormant_ratio_tau0_l0"] == pytest.approx(base["dormant_ratio_tau0_l0"] + 1 / 8)


def test_weight_change_known_answer_and_logged_per_update() -> None:
    before = [torch.ones(3), torch.full((4,), 2.0)]
    after = [b * 1.1 for b in before]
    assert weight_change(before, after) == pytest.approx(0.1)
    assert weight_change(before, before) == 0.0
    model = MoEPPO("MlpPolicy", make_vec_env("Pendulum-v1", n_envs=1, seed=0), n_steps=64, batch_size=32, n_epochs=2, seed=0, device="cpu")
    model.learn(64)
    assert 0.0 < model.logger.name_to_value["train/weight_change"] < 1.0
