"""A network takes what an env returns: numpy arrays and float64 observations (MetaWorld's) run
as the network's own dtype; a float32 tensor passes through untouched."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from stable_baselines3 import PPO

from rl_moe.nn import NetConfig, build_network
from rl_moe.policies import MoEActorCriticPolicy, actor_network


@pytest.mark.parametrize("kind", ["topk", "mlp", "soft", "ds"])
def test_numpy_and_float64_inputs_give_the_float32_result(kind: str) -> None:
    torch.manual_seed(0)
    net = build_network(39, 4, NetConfig(kind=kind, n_experts=4, top_k=2, hidden=(16, 16), gate_hidden=(8,)))
    obs = np.random.default_rng(0).normal(size=(8, 39))  # float64, as MetaWorld returns it
    want = net(torch.as_tensor(obs, dtype=torch.float32)).out
    for x in (obs, torch.as_tensor(obs), obs.tolist()):
        got = net(x).out
        assert got.dtype == torch.float32 and torch.equal(got, want)


def test_a_matching_tensor_is_not_copied() -> None:
    net = build_network(5, 2, NetConfig(kind="topk", n_experts=4, top_k=2, hidden=(8,), gate_hidden=(8,)))
    seen = []
    net.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    x = torch.randn(3, 5)
    net(x)
    assert seen[0] is x


def test_the_actor_of_a_trained_policy_takes_an_env_observation() -> None:
    model = PPO(MoEActorCriticPolicy, "Pendulum-v1", n_steps=32, batch_size=32, policy_kwargs={"moe": "topk", "n_experts": 4, "top_k": 2, "hidden": (16,), "gate_hidden": (8,)})
    obs, _ = model.get_env().envs[0].unwrapped.reset(seed=0)
    obs64 = np.asarray(obs, dtype=np.float64)[None]
    mean = actor_network(model.policy)(obs64).out
    torch.testing.assert_close(mean, model.policy.get_distribution(torch.as_tensor(obs64, dtype=torch.float32)).mode())
