"""Routers: weights, selection sets, capacity and coverage."""

import math

import pytest
import torch

from rl_moe.nn import NetConfig, build_network
from rl_moe.nn.routing import (
    ROUTERS,
    dense_routing,
    expert_choice_capacity,
    expert_choice_routing,
    make_dispatch,
    topk_routing,
)


@pytest.mark.parametrize("name", sorted(ROUTERS))
def test_selected_weights_sum_to_one_and_unselected_are_zero(name):
    torch.manual_seed(0)
    logits = torch.randn(64, 8)
    r = ROUTERS[name](logits, 2, 0.7)
    assert torch.allclose(r.probs.sum(1), torch.ones(64), atol=1e-6)
    assert torch.all(r.probs[~r.mask] == 0)
    assert torch.all(r.probs[r.mask] > 0)


def test_topk_picks_the_k_largest_logits_with_subset_softmax():
    torch.manual_seed(1)
    logits = torch.randn(32, 10)
    r = topk_routing(logits, 3, 2.0)
    expected = torch.sort(logits, dim=1, descending=True).indices[:, :3]
    assert torch.equal(torch.sort(r.indices, 1).values, torch.sort(expected, 1).values)
    sel = logits.gather(1, r.indices)
    assert torch.allclose(r.probs.gather(1, r.indices), torch.softmax(sel / 2.0, 1), atol=1e-7)
    assert r.mask.sum(1).eq(3).all()


def test_dense_router_is_full_softmax():
    logits = torch.randn(5, 4)
    r = dense_routing(logits, 1, 1.0)
    assert torch.allclose(r.probs, torch.softmax(logits, 1))
    assert r.mask.all()


@pytest.mark.parametrize("n,e,k", [(256, 10, 2), (7, 10, 2), (1, 4, 1), (33, 5, 3)])
def test_expert_choice_honours_capacity_and_covers_every_state(n, e, k):
    torch.manual_seed(n)
    logits = torch.randn(n, e) * 3
    r = expert_choice_routing(logits, k, 1.0)
    cap = expert_choice_capacity(n, e, k)
    assert cap == min(n, math.ceil(n * k / e))
    assert r.mask.any(1).all()  # every state is covered
    # The selection is exactly each expert's top-C states plus the arg-max expert of each orphan.
    affinity = torch.softmax(logits, 1)
    chosen = torch.zeros_like(r.mask).scatter(0, affinity.topk(cap, dim=0).indices, True)
    orphans = (~chosen.any(1)).nonzero()[:, 0]
    rescued = torch.zeros_like(r.mask)
    rescued[orphans, affinity[orphans].argmax(1)] = True
    assert torch.equal(r.mask, chosen | rescued)
    assert (chosen.sum(0) == cap).all()


def test_expert_choice_orphan_gets_argmax_expert():
    # C = 1: experts 0 and 1 both pick state 0, expert 2 picks state 1, so state 2 is an orphan.
    affinity = torch.tensor([[1 / 3, 1 / 3, 1 / 3], [0.32, 0.32, 0.36], [0.33, 0.33, 0.34]])
    r = expert_choice_routing(affinity.log(), 1, 1.0)
    assert r.mask.tolist() == [[True, True, False], [False, False, True], [False, False, True]]
    assert torch.allclose(r.probs[2], torch.tensor([0.0, 0.0, 1.0]))
    assert torch.allclose(r.probs[0], torch.tensor([0.5, 0.5, 0.0]))


def test_dispatch_is_sorted_by_expert_and_matches_mask():
    torch.manual_seed(2)
    r = topk_routing(torch.randn(40, 6), 2, 1.0)
    d = make_dispatch(r)
    assert torch.all(d.expert_idx[1:] >= d.expert_idx[:-1])
    assert sum(d.counts) == 80 and list(d.counts) == r.mask.sum(0).tolist()
    assert torch.equal(d.weight, r.probs[d.sample_idx, d.expert_idx])


def test_ds_shared_experts_are_always_active_and_parameter_matched():
    cfg = NetConfig(kind="ds", n_experts=10, top_k=2, hidden=(64, 64, 64), gate_hidden=(32,))
    ds = build_network(39, 4, cfg)
    topk = build_network(39, 4, cfg, kind="topk")
    n_ds = sum(p.numel() for p in ds.parameters())
    n_topk = sum(p.numel() for p in topk.parameters())
    assert abs(n_ds - n_topk) / n_topk <= 0.10
    out = ds(torch.randn(50, 39))
    shared = out.groups[0]
    assert shared.dispatch.counts == (50,) * cfg.n_shared
    assert torch.all(shared.dispatch.weight == 1)
    assert out.probs.shape[1] == ds.n_experts
    assert (out.probs > 0).sum(1).eq(ds.routed_k).all()


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(kind="bogus"), "topk"),
        (dict(top_k=11, n_experts=10), "top_k"),
        (dict(n_experts=0), "n_experts"),
        (dict(activation="gelu"), "relu"),
        (dict(temperature=0.0), "temperature"),
    ],
)
def test_bad_config_raises_value_error_naming_choices(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        NetConfig(**kwargs)


def test_every_router_is_a_network_kind_and_every_kind_builds():
    from rl_moe.nn import NETWORK_KINDS, NETWORKS
    from rl_moe.nn.config import UNROUTED_KINDS
    from rl_moe.nn.routing import ROUTERS

    assert NETWORK_KINDS == (*ROUTERS, *UNROUTED_KINDS) and len(set(NETWORK_KINDS)) == len(NETWORK_KINDS)
    assert set(NETWORKS) == set(NETWORK_KINDS)
