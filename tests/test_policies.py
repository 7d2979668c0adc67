"""SB3 integration: PPO/TD3 learn with every network kind, save/load, VecNormalize, torch access."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from rl_moe.algos import MoEPPO, MoETD3
from rl_moe.nn import NETWORK_KINDS, MoEOutput
from rl_moe.policies import MoEActorCriticPolicy, MoETD3Policy, actor_network, critic_networks
from tests.conftest import NETS, moe_ppo

TINY = NETS["tiny"]


def _ppo(env, kind, **kw):
    return moe_ppo(env, net="tiny", kind=kind, **kw)


def _td3(env, kind, **kw):
    return MoETD3(MoETD3Policy, env, learning_starts=64, batch_size=32, seed=0, device="cpu",
                  policy_kwargs=dict(moe=kind, **TINY), **kw)


def _params_changed(before, model):
    return any(not torch.equal(a, b) for a, b in zip(before, model.policy.parameters()))


@pytest.mark.parametrize("kind", NETWORK_KINDS)
def test_ppo_learns_with_every_kind(kind):
    model = _ppo(gym.make("Pendulum-v1"), kind, policy_kwargs=dict(critic_moe=True))
    before = [p.detach().clone() for p in model.policy.parameters()]
    model.learn(192)
    assert _params_changed(before, model)
    assert all(torch.isfinite(p).all() for p in model.policy.parameters())
    obs = torch.randn(32, 3)
    evaluated = model.policy.evaluate_actions_with_outputs(obs, torch.zeros(32, 1))
    assert isinstance(evaluated.actor, MoEOutput) and isinstance(evaluated.critic, MoEOutput)
    assert evaluated.actor.out.shape == (32, 1)
    values, log_prob, _ = model.policy.evaluate_actions(obs, torch.zeros(32, 1))
    torch.testing.assert_close(values, evaluated.values)
    torch.testing.assert_close(log_prob, evaluated.log_prob)


@pytest.mark.parametrize("kind", NETWORK_KINDS)
def test_td3_learns_with_every_kind(kind):
    model = _td3(gym.make("Pendulum-v1"), kind)
    before = [p.detach().clone() for p in model.policy.parameters()]
    model.learn(160)
    assert _params_changed(before, model)
    assert len(critic_networks(model.policy)) == 2
    obs, actions = torch.randn(8, 3), torch.zeros(8, 1)
    outputs = model.critic.forward_with_outputs(obs, actions)
    assert len(outputs) == 2 and all(isinstance(o, MoEOutput) for o in outputs)
    torch.testing.assert_close(model.critic(obs, actions)[1], outputs[1].out)
    assert isinstance(model.actor.forward_with_output(obs).output, MoEOutput)


@pytest.fixture(scope="module")
def metaworld_env_fn():
    import metaworld  # noqa: F401  (registers the Meta-World ids)

    return lambda: gym.make("Meta-World/MT1", env_name="reach-v3", seed=0, disable_env_checker=True, max_episode_steps=100)


@pytest.mark.parametrize("algo", ["ppo", "td3"])
def test_learns_on_a_real_metaworld_task(metaworld_env_fn, algo):
    env = DummyVecEnv([metaworld_env_fn])
    model = _ppo(env, "topk") if algo == "ppo" else _td3(env, "topk")
    before = [p.detach().clone() for p in model.policy.parameters()]
    model.learn(192)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.policy.parameters()))  # it trained
    obs = env.reset()
    action, _ = model.predict(obs, deterministic=True)
    # The action is the policy's own deterministic output (clipped to the box), recomputed here.
    with torch.no_grad():
        raw = model.policy._predict(torch.as_tensor(obs, dtype=torch.float32), deterministic=True).numpy()
    assert action.shape == (1, 4) and np.isfinite(raw).all()
    np.testing.assert_allclose(action, np.clip(raw, -1.0, 1.0), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("algo", ["ppo", "td3"])
def test_save_load_gives_identical_actions(tmp_path, algo):
    env = gym.make("Pendulum-v1")
    model = _ppo(env, "topk") if algo == "ppo" else _td3(env, "expert_choice")
    model.learn(96)
    model.save(tmp_path / "m.zip")
    loaded = type(model).load(tmp_path / "m.zip", device="cpu")
    obs = np.stack([env.observation_space.sample() for _ in range(16)])
    a, _ = model.predict(obs, deterministic=True)
    b, _ = loaded.predict(obs, deterministic=True)
    assert np.array_equal(a, b)
    assert loaded.policy.actor_cfg == model.policy.actor_cfg


def test_vecnormalize_round_trip(tmp_path):
    venv = VecNormalize(DummyVecEnv([lambda: gym.make("Pendulum-v1")]))
    model = _ppo(venv, "topk")
    model.learn(128)
    model.save(tmp_path / "m.zip")
    venv.save(str(tmp_path / "vn.pkl"))
    venv2 = VecNormalize.load(str(tmp_path / "vn.pkl"), DummyVecEnv([lambda: gym.make("Pendulum-v1")]))
    venv2.training = False
    venv.training = False
    loaded = MoEPPO.load(tmp_path / "m.zip", env=venv2, device="cpu")
    raw = np.stack([venv.observation_space.sample() for _ in range(8)])
    a, _ = model.predict(venv.normalize_obs(raw), deterministic=True)
    b, _ = loaded.predict(venv2.normalize_obs(raw), deterministic=True)
    assert np.array_equal(a, b)
    assert np.allclose(venv.obs_rms.mean, venv2.obs_rms.mean)


def test_actor_and_critic_sides_are_selectable():
    env = gym.make("Pendulum-v1")
    p = _ppo(env, "topk", policy_kwargs=dict(actor_moe=False, critic_moe=True)).policy
    assert p.actor_cfg.kind == "mlp" and p.critic_cfg.kind == "topk"
    t = MoETD3(MoETD3Policy, env, policy_kwargs=dict(moe="topk", critic_moe=False, **TINY)).policy
    assert t.actor_cfg.kind == "topk" and t.critic_cfg.kind == "mlp"


def test_torch_modules_are_reachable_and_usable_alone():
    env = gym.make("Pendulum-v1")
    model = _ppo(env, "topk")
    net = actor_network(model.policy)
    obs = torch.as_tensor(np.stack([env.observation_space.sample() for _ in range(5)]))
    mean = net(obs).out
    action, _ = model.predict(obs.numpy(), deterministic=True)
    assert np.allclose(np.clip(mean.detach().numpy(), -2, 2), action, atol=1e-6)


def test_bad_policy_kwargs_raise_value_error():
    env = gym.make("Pendulum-v1")
    with pytest.raises(ValueError, match="top_k"):
        _ppo(env, "topk", policy_kwargs=dict(top_k=9))
    with pytest.raises(ValueError, match="valid choices"):
        _ppo(env, "switch")


def test_optimizers_are_fused_adam_unless_the_user_chose() -> None:
    from rl_moe.policies.networks import fused_optimizer_kwargs

    env = gym.make("Pendulum-v1")
    ppo = MoEPPO(MoEActorCriticPolicy, env, n_steps=64, batch_size=32, policy_kwargs=dict(n_experts=3, hidden=(8,)))
    assert ppo.policy.optimizer.defaults["fused"] and ppo.policy.optimizer.defaults["eps"] == 1e-5  # SB3's PPO eps kept
    td3 = MoETD3(MoETD3Policy, env, policy_kwargs=dict(n_experts=3, hidden=(8,)))
    assert td3.policy.actor.optimizer.defaults["fused"] and td3.policy.critic.optimizer.defaults["fused"]
    mine = MoEPPO(MoEActorCriticPolicy, env, n_steps=64, batch_size=32, policy_kwargs=dict(n_experts=3, hidden=(8,), optimizer_kwargs={"foreach": False}))
    assert not mine.policy.optimizer.defaults.get("fused")
    assert fused_optimizer_kwargs(torch.optim.SGD, {"lr": 1.0}) == {"lr": 1.0}

    # Same updates as the reference (for-loop) Adam, to float rounding.
    torch.manual_seed(0)
    ref = [torch.randn(40, 30, requires_grad=True), torch.randn(30, requires_grad=True)]
    fused = [p.detach().clone().requires_grad_() for p in ref]
    opts = [torch.optim.Adam(ref, lr=1e-2, eps=1e-5), torch.optim.Adam(fused, lr=1e-2, **fused_optimizer_kwargs(torch.optim.Adam, {"eps": 1e-5}))]
    for _ in range(20):
        grads = [torch.randn_like(p) for p in ref]
        for params, opt in zip((ref, fused), opts):
            for p, g in zip(params, grads):
                p.grad = g.clone()
            opt.step()
    for a, b in zip(ref, fused):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _layer_widths(net):
    """Output widths of a MoE network's expert layers (heads included)."""
    return [w.shape[-1] for w in net.experts.weights]


def test_sb3_net_arch_list_sets_the_expert_widths_of_both_sides():
    env = gym.make("Pendulum-v1")
    td3 = MoETD3(MoETD3Policy, env, seed=0, device="cpu", policy_kwargs=dict(moe="topk", n_experts=4, net_arch=[24, 12], activation_fn=torch.nn.Tanh))
    for net in (actor_network(td3.policy), *critic_networks(td3.policy)):
        assert _layer_widths(net) == [24, 12, 1]
        assert net.cfg.activation == "tanh"
    ppo = MoEPPO(MoEActorCriticPolicy, env, n_steps=64, batch_size=32, seed=0, device="cpu", policy_kwargs=dict(moe="topk", n_experts=4, net_arch=[24, 12]))
    assert _layer_widths(actor_network(ppo.policy)) == [24, 12, 1]
    assert ppo.policy.critic_net.cfg.hidden == (24, 12)  # the dense critic keeps the same widths


def test_sb3_net_arch_dict_sets_each_side_and_survives_save_load(tmp_path):
    env = gym.make("Pendulum-v1")
    model = MoETD3(MoETD3Policy, env, seed=0, device="cpu", policy_kwargs=dict(moe="topk", n_experts=4, net_arch=dict(pi=[20], qf=[28, 8])))
    assert _layer_widths(actor_network(model.policy)) == [20, 1]
    assert all(_layer_widths(q) == [28, 8, 1] for q in critic_networks(model.policy))
    model.save(tmp_path / "m.zip")
    loaded = MoETD3.load(tmp_path / "m.zip", device="cpu")
    assert _layer_widths(actor_network(loaded.policy)) == [20, 1]
    obs = torch.randn(5, 3)
    torch.testing.assert_close(loaded.actor(obs), model.actor(obs))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(net_arch=[64, 64], hidden=(32, 32)), "net_arch gives hidden"),
        (dict(net_arch=[64, 0]), "positive ints"),
        (dict(net_arch=dict(pi=[8], bogus=[8])), "unknown net_arch key"),
        (dict(activation_fn=torch.nn.GELU), "unsupported activation_fn .*torch.nn.ReLU, torch.nn.Tanh"),
        (dict(activation_fn=torch.nn.ReLU, activation="tanh"), "activation_fn gives activation"),
    ],
)
def test_sb3_arch_arguments_that_cannot_apply_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MoETD3(MoETD3Policy, gym.make("Pendulum-v1"), seed=0, device="cpu", policy_kwargs=dict(moe="topk", n_experts=4, **kwargs))
