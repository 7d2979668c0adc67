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


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["topk", "mlp", "soft", "ds", "dsc", "sdmoe"])
def test_one_unbatched_observation_gives_the_batched_row_without_its_batch_axis(kind: str, dtype: type) -> None:
    """``(obs_dim,)``, as ``env.reset()`` returns it, runs like a batch of one; ``out`` is
    ``(out_dim,)`` (what ``env.step`` takes), the routing fields lose the batch axis too."""
    torch.manual_seed(0)
    net = build_network(39, 4, NetConfig(kind=kind, n_experts=4, top_k=2, hidden=(16, 16), gate_hidden=(8,)))
    obs = np.random.default_rng(1).normal(size=39).astype(dtype)
    want = net(torch.as_tensor(obs[None], dtype=torch.float32))
    for x in (obs, torch.as_tensor(obs)):
        got = net(x)
        assert got.out.shape == (4,) and got.out.dtype == torch.float32 and torch.equal(got.out, want.out[0])
        assert torch.equal(got.probs, want.probs[0]) and torch.equal(got.indices, want.indices[0])
        assert torch.equal(got.phi(), want.phi()[0]) and got.phi().ndim == 1  # (m,), as out is (D,)
        assert got.groups[0].dispatch.n_samples == 1  # the groups keep the batch of one
    assert net(torch.as_tensor(obs[None], dtype=torch.float32)).out.shape == (1, 4)  # a batch of one stays one


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("algo", ["ppo", "td3"])
def test_the_actor_of_a_policy_takes_one_env_observation(algo: str, dtype: type) -> None:
    from stable_baselines3 import TD3

    from rl_moe.policies import MoETD3Policy

    kwargs = {"moe": "topk", "n_experts": 4, "top_k": 2, "hidden": (16,), "gate_hidden": (8,)}
    if algo == "ppo":
        model = PPO(MoEActorCriticPolicy, "Pendulum-v1", n_steps=32, batch_size=32, policy_kwargs=kwargs)
    else:
        model = TD3(MoETD3Policy, "Pendulum-v1", learning_starts=10, buffer_size=100, policy_kwargs=kwargs)
    obs, _ = model.get_env().envs[0].unwrapped.reset(seed=0)
    obs = np.asarray(obs, dtype=dtype)  # (3,)
    net = actor_network(model.policy)
    got = net(obs).out
    assert got.shape == (1,) and torch.equal(got, net(torch.as_tensor(obs[None], dtype=torch.float32)).out[0])
