"""Each of these tests fails on one broken copy of a plasticity method that once passed the whole
suite (issue 72): NaP built without LayerNorm, NaP projecting once per rollout instead of after
every optimizer step, reset not copying its fresh weights into TD3's target networks, plasticity
injection cutting the torso's gradient through the frozen copy, TRAC's defaults moved from the
paper's, and deep Fourier features initialised with ReLU's gain."""

from __future__ import annotations

import inspect

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from rl_moe.regularizers import make_regularizer
from tests.conftest import moe_ppo


def _built(method: str, algo: str = "ppo"):
    from rl_moe.continual.agents import build_model
    from rl_moe.continual.resolve import RunRequest, resolve, suite_of
    from rl_moe.envs.factories import make_vec_env, task_factories

    cfg = resolve(RunRequest(suite="smoke", algo=algo, method=method, tasks=1, steps_per_task=64, preset="tiny"))
    suite = suite_of(cfg)
    return build_model(cfg, make_vec_env(task_factories(suite, suite.tasks[0], 1, 0), "dummy"), "cpu")


# --- NaP ------------------------------------------------------------------------------------------


def test_the_nap_method_normalizes_before_every_hidden_nonlinearity() -> None:
    """NaP's projection assumes normalized layers (its function does not depend on the norms it
    fixes): the method's actor has a LayerNorm after each hidden layer of every expert and the gate."""
    model = _built("nap")
    actor = model.policy.actor_net
    hidden = len(actor.experts.weights) - 1  # the last weight is the head
    assert hidden == 2 and len(actor.experts.ln_weights) == hidden  # the stacked experts' LayerNorm affines
    assert [tuple(w.shape) for w in actor.experts.ln_weights] == [tuple(b.shape) for b in actor.experts.biases[:hidden]]
    assert any(isinstance(m, nn.LayerNorm) for m in actor.gate.modules())
    assert not hasattr(_built("topk").policy.actor_net.experts, "ln_weights") or len(_built("topk").policy.actor_net.experts.ln_weights) == 0


def test_nap_projects_after_every_optimizer_step_not_once_per_rollout() -> None:
    """Before each optimizer step, every projected matrix is back at its initial norm: the step
    before it was projected. A projection once per rollout leaves the norms off between the
    minibatch steps of an update."""
    reg = make_regularizer("nap")
    model = moe_ppo(regularizers=[reg], n_epochs=2, batch_size=16, learning_rate=3e-2, policy_kwargs={"layer_norm": True})
    checked: list[float] = []

    def before_step(opt, args, kwargs) -> None:  # type: ignore[no-untyped-def]
        for w, stacked in reg._weights.get("actor", ()):
            norms = w.detach().flatten(1).norm(dim=1) if stacked else w.detach().norm()
            checked.append(float((norms / reg._init[id(w)] - 1).abs().max()))

    model.learn(64)  # training starts: the initial norms are taken
    handle = model.policy.optimizer.register_step_pre_hook(before_step)
    model.learn(128, reset_num_timesteps=False)
    handle.remove()
    steps = 2 * (128 // 16)  # 2 rollouts... of 64 steps x 2 epochs x 4 minibatches
    assert len(checked) >= steps and max(checked) < 1e-5, max(checked)


# --- reset under TD3 --------------------------------------------------------------------------------


def test_reset_copies_its_fresh_weights_into_td3s_target_networks() -> None:
    """After training, the targets lag their networks (Polyak); a reset draws fresh heads and the
    targets take exactly those values, while the tensors it leaves alone keep their lag."""
    from rl_moe.algos import MoETD3
    from rl_moe.policies import MoETD3Policy

    reg = make_regularizer("reset", target="both")
    model = MoETD3(MoETD3Policy, gym.make("Pendulum-v1"), regularizers=[reg], learning_starts=16, batch_size=16, seed=0, device="cpu",
                   policy_kwargs={"n_experts": 4, "top_k": 2, "hidden": (16, 16)})  # fmt: skip
    model.learn(64)
    reg.apply(model.policy)
    from rl_moe.policies import policy_roles

    pairs = [pair for role in policy_roles(model.policy).values() for pair in zip(role.networks, role.targets)]
    assert len(pairs) == 3  # the actor and the two critics, each with its target
    for net, target in pairs:
        online, lagged = dict(net.named_parameters()), dict(target.named_parameters())
        head = net.experts.weights[-1]
        name = next(k for k, v in online.items() if v is head)
        assert torch.equal(online[name], lagged[name]), name  # the fresh head, in both
        first = next(k for k, v in online.items() if v is net.experts.weights[0])
        assert not torch.equal(online[first], lagged[first])  # not reset: the target still lags


def _orthogonal_with(m: torch.Tensor, gain: float) -> bool:
    """``m`` (a, b) has orthogonal columns (a >= b) or rows (a < b), each of norm ``gain``."""
    g = m.T @ m if m.shape[0] >= m.shape[1] else m @ m.T
    return torch.allclose(g, gain**2 * torch.eye(g.shape[0], dtype=m.dtype), atol=1e-5)


def test_reset_draws_each_layer_as_at_construction_and_counts_what_it_reset() -> None:
    """The fresh tensors of a reset, layer by layer: every expert's matrix orthogonal with its
    layer's gain (hidden: the activation's, the head: the stack's own), biases 0, a reset hidden
    layer's LayerNorm back to (1, 0), the router logits orthogonal with gain 1 and drawn from the
    reset's seed; ``layers`` at the expert's depth resets the first layer too."""
    from rl_moe.nn import NetConfig, build_network
    from rl_moe.nn.experts import ACTIVATION_GAINS
    from rl_moe.regularizers.reset import Reset, ResetConfig, _fresh_values, _orthogonal

    with pytest.raises(ValueError, match="reset layers must be >= 1, got 0"):
        ResetConfig(layers=0)
    with pytest.raises(ValueError, match="reset every_updates must be >= 0, got -1"):
        ResetConfig(every_updates=-1)
    assert Reset(ResetConfig(layers=2, gate=True, seed=5)).config == ResetConfig(layers=2, gate=True, seed=5)  # the config given
    assert Reset().logs() == {"reset_count": 0.0, "reset_params": 0.0}
    gen = torch.Generator().manual_seed(0)
    assert _orthogonal(torch.zeros(3, 5, 4, dtype=torch.float64), 1.0, gen).dtype == torch.float64
    assert _orthogonal(torch.empty(3, 5, 4, device="meta"), 1.0, gen).device.type == "meta"  # drawn on the CPU, put where the tensor lives

    net = build_network(5, 3, NetConfig(hidden=(8, 6), gate_hidden=(6,), n_experts=4, layer_norm=True))
    stack = net.experts
    n = stack.n_layers
    names = {id(p): k for k, p in net.named_parameters()}
    for layers in (1, 2, n):
        fresh = dict(_fresh_values(net, layers, True, torch.Generator().manual_seed(7)))
        again = dict(_fresh_values(net, layers, True, torch.Generator().manual_seed(7)))
        assert fresh.keys() == again.keys() and all(torch.equal(fresh[k], again[k]) for k in fresh)  # the seed decides
        for layer in range(n):
            w, b = names[id(stack.weights[layer])], names[id(stack.biases[layer])]
            assert (w in fresh) == (b in fresh) == (layer >= n - layers), (layers, layer)
            if w not in fresh:
                continue
            gain = stack.out_gain if layer == n - 1 else ACTIVATION_GAINS[stack.activation]
            assert all(_orthogonal_with(m, gain) for m in fresh[w]) and not torch.any(fresh[b])
            if layer < n - 1:  # a hidden layer: its LayerNorm affine back to (1, 0)
                lw, lb = names[id(stack.ln_weights[layer])], names[id(stack.ln_biases[layer])]
                assert torch.equal(fresh[lw], torch.ones_like(stack.ln_weights[layer])) and not torch.any(fresh[lb])
        logits = net.gate_mlp().logits
        assert _orthogonal_with(fresh[names[id(logits.weight)]], 1.0) and not torch.any(fresh[names[id(logits.bias)]])
        assert len(fresh) == 2 * layers + 2 * min(layers - 1, n - 1) + 2  # weights, biases, LayerNorms, logits


def test_reset_every_update_counts_gradient_steps_from_zero() -> None:
    from rl_moe.regularizers.reset import Reset

    reg = Reset(every_updates=1)
    applied: list[int] = []
    reg.apply = lambda policy: applied.append(reg._updates)  # type: ignore[method-assign]
    for _ in range(3):
        reg.after_update(type("Algo", (), {"policy": None})(), "ppo")
    assert applied == [1, 2, 3]


# --- plasticity injection ---------------------------------------------------------------------------


def test_injection_gives_td3s_target_networks_the_same_fresh_heads() -> None:
    """TD3's targets take the injection too: each target's stack gets the fresh head its network
    got (the same values, frozen head and copy alike), so the targets' function is unchanged."""
    from rl_moe.algos import MoETD3
    from rl_moe.nn.inject import injected_stacks
    from rl_moe.policies import MoETD3Policy, policy_roles
    from rl_moe.regularizers.injection import InjectionConfig, PlasticityInjection

    reg = PlasticityInjection(InjectionConfig(target="both", seed=3))
    assert reg.config == InjectionConfig(target="both", seed=3)  # the config given, not the defaults
    model = MoETD3(MoETD3Policy, gym.make("Pendulum-v1"), regularizers=[reg], learning_starts=16, batch_size=16, seed=0, device="cpu",
                   policy_kwargs={"n_experts": 4, "top_k": 2, "hidden": (16, 16)})  # fmt: skip
    model.learn(64)
    pairs = [pair for role in policy_roles(model.policy).values() for pair in zip(role.networks, role.targets)]
    assert len(pairs) == 3  # the actor and the two critics, each with its target
    reg.apply(model.policy)
    for net, target in pairs:
        stacks, twins = injected_stacks(net), injected_stacks(target)
        assert stacks.keys() == twins.keys() and stacks
        for key, stack in stacks.items():
            got, want = twins[key].injected, stack.injected
            assert len(got) == len(want) == 1, key
            for a, b in zip([*got.heads_w, *got.heads_b, *got.start_w, *got.start_b], [*want.heads_w, *want.heads_b, *want.start_w, *want.start_b]):
                assert a is not b and torch.equal(a, b), key  # the same values, in tensors of its own
            assert not twins[key].weights[-1].requires_grad  # its old head frozen, as the network's


def test_injection_keeps_the_torsos_gradient() -> None:
    """At the injection the network's function is unchanged, so is the gradient of any loss with
    respect to the torso (the experts' hidden layers): it flows through the frozen head and the
    frozen copy of the fresh one alike."""
    model = moe_ppo(regularizers=[make_regularizer("injection")], policy_kwargs={"critic_moe": True})
    model.learn(64)
    actor = model.policy.actor_net
    obs = torch.randn(32, 3, generator=torch.Generator().manual_seed(2))
    torso = [actor.experts.weights[0], actor.experts.biases[0], actor.experts.weights[1]]

    def torso_grads() -> list[torch.Tensor]:
        for p in torso:
            p.grad = None
        (actor(obs).out ** 2).sum().backward()
        return [p.grad.detach().clone() for p in torso]

    before = torso_grads()
    model.start_task(1)
    after = torso_grads()
    for a, b in zip(before, after):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)
        assert b.abs().sum() > 0


# --- TRAC -------------------------------------------------------------------------------------------


def test_trac_defaults_are_the_papers() -> None:
    """Muppidi et al. (2024): betas 0.9, 0.99, ..., 0.999999; s_prior = eps = 1e-8; our sigma starts at 0."""
    from rl_moe.algos.trac import TRAC, TRAC_BETAS

    assert TRAC_BETAS == (0.9, 0.99, 0.999, 0.9999, 0.99999, 0.999999)
    defaults = {k: p.default for k, p in inspect.signature(TRAC.__init__).parameters.items() if p.default is not inspect.Parameter.empty}
    assert defaults == {"lr": 1e-3, "betas_trac": TRAC_BETAS, "s_prior": 1e-8, "trac_eps": 1e-8, "displacement": "kept", "sigma_init": 0.0}
    opt = TRAC([nn.Parameter(torch.zeros(2))])
    assert opt.trac["betas"].tolist() == list(TRAC_BETAS) and (opt.trac["s_prior"], opt.trac["eps"]) == (1e-8, 1e-8)
    assert opt.param_groups[0]["lr"] == 1e-3
    # the tuners run in float64 (S sums erfi terms that reach 1e172; h^2 underflows in float32)
    assert {k: opt.trac[k].dtype for k in ("betas", "v", "sigma", "scale")} == dict.fromkeys(("betas", "v", "sigma", "scale"), torch.float64)
    with pytest.raises(ValueError, match="unknown TRAC displacement 'kep'; valid choices: kept, recovered"):
        TRAC([nn.Parameter(torch.zeros(2))], displacement="kep")


# --- deep Fourier features --------------------------------------------------------------------------


def test_fourier_features_are_initialised_with_gain_one() -> None:
    """sin and cos have unit slope at 0: the linear layers before them are orthogonal with gain 1
    (ReLU's sqrt(2) would double the pre-activation variance), so W^T W = I for every expert's
    first layer (more outputs than inputs: orthonormal columns)."""
    model = _built("fourier")
    first = model.policy.actor_net.experts.weights[0].detach()  # (E, in, out)
    for w in first:
        gram = (w @ w.T).numpy()  # (in, in): the input-side columns of the (out, in) matrix
        np.testing.assert_allclose(gram, np.eye(gram.shape[0]), atol=1e-5)


@pytest.mark.parametrize("method", ["topk", "crelu"])
def test_relu_networks_keep_gain_sqrt2(method: str) -> None:
    """The reference the Fourier test stands against: ReLU and CReLU layers take gain sqrt(2)."""
    first = _built(method).policy.actor_net.experts.weights[0].detach()
    for w in first:
        np.testing.assert_allclose((w @ w.T).numpy(), 2.0 * np.eye(w.shape[0]), atol=1e-5)
