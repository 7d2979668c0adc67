"""Weight initialisation schemes (rl_moe/nn/init.py): Flax's lecun_normal, and the default unchanged."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch import nn

from rl_moe.continual.agents import net_configs_for
from rl_moe.continual.resolve import RunRequest, resolve
from rl_moe.nn import NetConfig, build_network
from rl_moe.nn.experts import StackedExperts
from rl_moe.nn.init import INITS, lecun_normal_
from rl_moe.policies import MoEActorCriticPolicy


def test_lecun_normal_has_variance_one_over_fan_in_and_is_truncated_at_two_sigma() -> None:
    torch.manual_seed(0)
    w = torch.empty(400, 500)
    lecun_normal_(w, fan_in=64)
    std = 1 / 8 / 0.87962566103423978  # before truncation
    assert abs(float(w.std()) - 1 / 8) < 0.002  # the truncated draw keeps variance 1/fan_in
    assert float(w.abs().max()) <= 2 * std + 1e-7
    assert float(w.abs().max()) > 1.9 * std  # truncated, not clipped to a smaller bound


@pytest.mark.parametrize("kind", INITS["lecun"].kinds)
def test_lecun_reinitialises_every_weight_of_every_covered_kind(kind: str) -> None:
    torch.manual_seed(1)
    net = build_network(39, 4, NetConfig(kind=kind, n_experts=6, hidden=(64, 64), gate_hidden=(32,), init="lecun", layer_norm=True))
    weights = 0
    for module in net.modules():
        if type(module) is StackedExperts:
            for w in module.weights:  # (E, in, out): fan_in is the input width, heads included
                assert abs(float(w.detach().std()) - 1 / math.sqrt(w.shape[1])) < 0.15 / math.sqrt(w.shape[1])
                weights += 1
            assert all(float(b.detach().abs().max()) == 0.0 for b in module.biases)
            if module.layer_norm:
                assert all(torch.equal(g, torch.ones_like(g)) for g in module.ln_weights)
        elif isinstance(module, nn.Linear):
            assert abs(float(module.weight.detach().std()) - 1 / math.sqrt(module.in_features)) < 0.2 / math.sqrt(module.in_features)
            assert float(module.bias.detach().abs().max()) == 0.0
            weights += 1
    assert weights >= 3


def test_orthogonal_is_the_default_and_leaves_networks_as_built() -> None:
    torch.manual_seed(2)
    default = build_network(39, 4, NetConfig(n_experts=4, hidden=(32, 32)), out_gain=0.01)
    torch.manual_seed(2)
    named = build_network(39, 4, NetConfig(n_experts=4, hidden=(32, 32), init="orthogonal"), out_gain=0.01)
    for a, b in zip(default.parameters(), named.parameters()):
        assert torch.equal(a, b)
    head = default.experts.weights[-1][0]  # (32, 4), orthogonal columns with gain 0.01
    assert torch.allclose(head.T @ head, 1e-4 * torch.eye(4), atol=1e-9)


def test_lecun_mean_head_is_not_scaled_down_as_sb3s_is() -> None:
    box = lambda d: spaces.Box(-1, 1, (d,), np.float32)  # noqa: E731
    heads = {}
    for init in INITS:
        torch.manual_seed(3)
        cfg = NetConfig(n_experts=4, hidden=(64, 64), init=init)
        policy = MoEActorCriticPolicy(box(39), box(4), lambda _: 3e-4, actor_cfg=cfg, critic_cfg=NetConfig(kind="mlp", hidden=(64, 64), init=init))
        heads[init] = float(policy.actor_net.experts.weights[-1].detach().std())
    assert heads["orthogonal"] == pytest.approx(0.01 / math.sqrt(64), rel=0.1)  # gain 0.01 over 64 rows
    assert heads["lecun"] == pytest.approx(1 / math.sqrt(64), rel=0.1)


def test_cli_setting_reaches_actor_and_critic() -> None:
    cfg = resolve(RunRequest(suite="cw10-cw", method="topk", tasks=1, device="cpu", vec_env="dummy", overrides=("net.init=lecun",)))
    nets = net_configs_for(cfg, 39, 4)
    assert nets.actor.init == nets.critic.init == "lecun"
    assert cfg.to_dict()["net"]["init"] == "lecun"  # recorded in config.json
