"""Spectral normalization as a network option (NetConfig.spectral_norm)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch.nn.utils import parametrize

from rl_moe.algos import MoEPPO, MoETD3
from rl_moe.continual.resolve import RunRequest, resolve
from rl_moe.errors import UsageError
from rl_moe.nn import NetConfig, StackedSpectralNorm, build_network, hidden_weights
from rl_moe.policies import MoEActorCriticPolicy, MoETD3Policy
from rl_moe.regularizers.targets import role_hidden_weights

# its own size: the power-iteration tolerance after one step below holds for these widths
ARCH = dict(n_experts=3, top_k=2, hidden=(8, 8), gate_hidden=(8,))


def _sigmas(refs) -> torch.Tensor:
    return torch.cat([torch.linalg.matrix_norm(r.rows_out().detach(), ord=2) for r in refs])


def _assert_unit(refs, tol: float = 2e-3) -> None:
    sigma = _sigmas(refs)
    torch.testing.assert_close(sigma, torch.ones_like(sigma), rtol=tol, atol=tol)


@pytest.mark.parametrize("kind", ["topk", "ds", "mlp"])
def test_build_network_normalises_every_hidden_layer(kind: str) -> None:
    net = build_network(5, 2, NetConfig(kind=kind, spectral_norm=True, **ARCH))
    refs = hidden_weights(net)
    assert refs and all(parametrize.is_parametrized(r.module, r.name) for r in refs)
    _assert_unit(refs)  # 15 power steps at construction
    plain = build_network(5, 2, NetConfig(kind=kind, **ARCH))
    assert not any(parametrize.is_parametrized(r.module, r.name) for r in hidden_weights(plain))


def test_spectral_norm_gives_unit_sigma_and_keeps_training() -> None:
    obs, act = spaces.Box(-1, 1, (5,), np.float32), spaces.Box(-1, 1, (2,), np.float32)
    actor = NetConfig(spectral_norm=True, **ARCH)
    policy = MoEActorCriticPolicy(obs, act, lambda _: 1e-2, actor_cfg=actor, critic_cfg=NetConfig(kind="mlp", **ARCH))
    refs = role_hidden_weights(policy.roles()["actor"])
    assert len(refs) == 3  # two expert layers (stacked) + the gate body layer
    assert not any(parametrize.is_parametrized(r.module, r.name) for r in role_hidden_weights(policy.roles()["critic"]))
    for _ in range(5):
        policy.actor_net(torch.randn(16, 5))
    _assert_unit(refs)
    original = policy.actor_net.experts.weights.parametrizations["0"].original
    assert any(p is original for p in policy.optimizer.param_groups[0]["params"])
    before = original.detach().clone()
    policy.optimizer.zero_grad()
    policy.actor_net(torch.randn(16, 5)).out.sum().backward()
    policy.optimizer.step()
    assert not torch.equal(before, original.detach())
    policy.actor_net(torch.randn(16, 5))
    _assert_unit(refs, tol=5e-2)  # one power step behind the update


def test_spectral_norm_on_td3_targets_follows_polyak_updates() -> None:
    model = MoETD3(
        MoETD3Policy, gym.make("Pendulum-v1"), learning_starts=16, batch_size=16, tau=0.5,
        policy_kwargs=dict(spectral_norm=True, **ARCH), seed=0,
    )
    model.learn(64)
    torch.manual_seed(0)
    with torch.no_grad():  # a large drift of the target weights, as Polyak averaging would bring
        for module in (model.policy.actor_target, model.policy.critic_target):
            for name, p in module.named_parameters():
                if name.endswith("original"):
                    p.add_(torch.randn_like(p) * p.std())
    x = torch.randn(4, 3)
    for _ in range(20):  # eval-mode forwards: the targets' vectors keep tracking their weights
        model.policy.actor_target(x)
        model.policy.critic_target(x, torch.zeros(4, 1))
    for role in model.policy.roles().values():
        assert role_hidden_weights(role, targets=True)
        _assert_unit(role_hidden_weights(role, targets=True), tol=5e-2)


def _norm_buffers(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in policy.state_dict().items() if k.endswith(("._u", "._v"))}


@pytest.mark.parametrize("algo", ["ppo", "td3"])
def test_checkpoint_round_trip_keeps_the_power_iteration_state(algo: str, tmp_path) -> None:
    kwargs = dict(policy_kwargs=dict(actor_cfg=NetConfig(spectral_norm=True, **ARCH), critic_cfg=NetConfig(kind="mlp", **ARCH)), seed=0)
    if algo == "ppo":
        model = MoEPPO(MoEActorCriticPolicy, gym.make("Pendulum-v1"), n_steps=64, batch_size=32, n_epochs=2, **kwargs)
    else:
        model = MoETD3(MoETD3Policy, gym.make("Pendulum-v1"), learning_starts=16, batch_size=16, **kwargs)
    model.learn(64)
    buffers = _norm_buffers(model.policy)
    assert buffers and all(k.startswith(("mlp_extractor.actor_net", "actor")) for k in buffers)
    model.save(tmp_path / "model.zip")
    loaded = type(model).load(tmp_path / "model.zip", env=gym.make("Pendulum-v1"))
    assert loaded.policy.actor_cfg.spectral_norm and not loaded.policy.critic_cfg.spectral_norm
    for key, value in buffers.items():
        torch.testing.assert_close(loaded.policy.state_dict()[key], value, rtol=0, atol=0)
    obs = torch.randn(8, 3)
    model.policy.set_training_mode(False), loaded.policy.set_training_mode(False)
    with torch.no_grad():
        torch.testing.assert_close(loaded.policy._predict(obs, deterministic=True), model.policy._predict(obs, deterministic=True))
    assert any(isinstance(m, StackedSpectralNorm) for m in loaded.policy.modules())


@pytest.mark.parametrize("algo", ["ppo", "td3"])
def test_specnorm_method_normalises_the_actor(algo: str) -> None:
    from rl_moe.continual.agents import net_configs_for

    cfg = resolve(RunRequest(suite="smoke", algo=algo, method="specnorm", tasks=1, preset="tiny"))
    nets = net_configs_for(cfg, 4, 2)
    assert nets.actor.spectral_norm and not nets.critic.spectral_norm and cfg.net.kind == "topk"
    both = resolve(RunRequest(suite="smoke", algo=algo, method="topk", tasks=1, preset="tiny", overrides=("net.spectral_norm=true",)))
    assert all(c.spectral_norm for c in net_configs_for(both, 4, 2))


def test_net_kind_is_the_methods() -> None:
    with pytest.raises(UsageError, match="the network kind is the method's"):
        resolve(RunRequest(suite="smoke", method="sphere", tasks=1, overrides=("net.kind=soft",)))
    assert resolve(RunRequest(suite="smoke", method="dense", tasks=1)).net.kind == "mlp"


def test_old_net_section_loads_and_round_trips() -> None:
    from rl_moe.continual.config import NetSettings, RunConfig

    old = {  # the net section of config.json before it was a NetConfig
        "hidden": [32, 32], "n_experts": 4, "top_k": 2, "activation": "relu", "temperature": 1.0, "gate_hidden": [16],
        "actor_moe": True, "critic_moe": False, "sd_rank_fraction": 0.01, "dsc_atoms": 0, "dsc_top_k": 4,
        "ssmoe_alpha": 0.7, "ssmoe_top_c": 2,
    }
    cfg = RunConfig.from_dict({"suite": "smoke", "suite_data": {}, "tasks": ["a"], "method": "specnorm", "net": old})
    assert isinstance(cfg.net, NetConfig) and cfg.net.hidden == (32, 32) and cfg.net.critic_moe is False
    assert not cfg.net.spectral_norm
    assert RunConfig.from_dict(cfg.to_dict()).net == cfg.net
    assert cfg.net.network(kind="mlp") == NetConfig(kind="mlp", n_experts=4, hidden=(32, 32), gate_hidden=(16,))
    assert NetSettings(n_experts=1).top_k == 2  # checked later, once every --set is in
