"""The MoENetwork protocol: every network kind exposes its parts, consistent with its output."""

import gymnasium as gym
import pytest
import torch
from torch import nn

from rl_moe.nn import NETWORK_KINDS, EVRerouted, MoENetwork, build_network
from rl_moe.nn.specnorm import expert_stacks, hidden_weights
from rl_moe.policies import MoEActorCriticPolicy, MoETD3Policy, actor_network, policy_roles

ARCH = dict(n_experts=6, top_k=2, hidden=(12, 8), gate_hidden=(5,))


@pytest.mark.parametrize("kind", NETWORK_KINDS)
def test_every_kind_is_a_moe_network_whose_parts_match_its_output(kind):
    torch.manual_seed(0)
    net = build_network(7, 3, **ARCH, kind=kind)
    assert isinstance(net, MoENetwork)
    out = net(torch.randn(40, 7))
    stacks = net.expert_stacks()
    # one stack per output group, in the same order, with the widths the group's features have
    assert len(stacks) == len(out.groups)
    for stack, group in zip(stacks, out.groups):
        assert [h.shape[1] for h in group.expert.hidden] == list(stack.hidden_dims)
        assert group.dispatch.n_experts == stack.n_experts
    routed = net.routed_experts()
    rows = net.router_rows()
    if routed is None:  # one expert (dense MLP, the DSC trunk): nothing for a router to choose
        assert net.experts.n_experts == 1
    else:
        assert routed is stacks[-1] and routed.n_experts == net.n_experts > 1
        assert rows is not None and rows.shape[0] == net.n_experts and not rows.requires_grad
        if net.gate_mlp() is not None:
            assert torch.equal(rows, net.gate_mlp().logits.weight)
            _, logits = net.gate_mlp()(torch.randn(4, 7))
            assert logits.shape == (4, net.n_experts)
        if kind in ("topk", "ds", "sdmoe", "ssmoe"):  # routers with a fixed number of experts per state
            assert ((out.probs > 0).sum(1) == net.routed_top_k()).all()


def test_a_plain_module_is_not_a_moe_network_and_has_no_expert_stacks():
    mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    assert not isinstance(mlp, MoENetwork)
    assert expert_stacks(mlp) == []
    assert [r.module for r in hidden_weights(mlp)] == [mlp[0]]


def test_rerouted_network_exposes_the_parts_of_the_network_it_wraps():
    net = build_network(7, 3, **ARCH, kind="topk")
    wrapped = EVRerouted(net, alpha=0.7)
    assert isinstance(wrapped, MoENetwork)
    assert wrapped.experts is net.experts and wrapped.gate_mlp() is net.gate and wrapped.cfg is net.cfg
    assert torch.equal(wrapped.router_rows(), net.router_rows())


@pytest.mark.parametrize("policy_class", [MoEActorCriticPolicy, MoETD3Policy])
def test_replace_actor_network_swaps_what_the_policy_acts_with(policy_class):
    env = gym.make("Pendulum-v1")
    policy = policy_class(env.observation_space, env.action_space, lambda _: 1e-3, moe="topk", **ARCH)
    before = actor_network(policy)
    policy.replace_actor_network(lambda net: EVRerouted(net, alpha=1.0))
    after = actor_network(policy)
    assert isinstance(after, EVRerouted) and after.net is before
    assert policy_roles(policy)["actor"].networks == (after,)
