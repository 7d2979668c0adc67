"""Routers: gate logits -> per-state expert weights, and the dispatch plan they imply.

Every router returns weights that are zero off the selected set and sum to one on it, so the
layer output is always ``sum_e h_e(x) * head_e(feat_e(x))``.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch
from torch import Tensor


class Routing(NamedTuple):
    """Routing decision for a batch of N states over E experts."""

    probs: Tensor  # (N, E) weights, exactly 0 for unselected experts
    mask: Tensor  # (N, E) bool, selected experts
    indices: Tensor  # (N, K) selected expert ids, -1 padded when a state has fewer than K


class Dispatch(NamedTuple):
    """(state, expert) pairs of a routing, sorted by expert so each expert owns a contiguous slice."""

    sample_idx: Tensor  # (R,) long
    expert_idx: Tensor  # (R,) long, non-decreasing
    weight: Tensor  # (R,) routing weight h_{i,e}; differentiable w.r.t. the gate
    counts: tuple[int, ...]  # (E,) rows per expert
    n_samples: int

    @property
    def n_experts(self) -> int:
        return len(self.counts)


def _indices_from_mask(mask: Tensor, probs: Tensor) -> Tensor:
    k = int(mask.sum(1).max().item()) if mask.numel() else 0
    top = probs.masked_fill(~mask, -1.0).topk(max(k, 1), dim=1)
    return torch.where(top.values >= 0, top.indices, torch.full_like(top.indices, -1))


def topk_routing(logits: Tensor, k: int, temperature: float) -> Routing:
    """Top-K with a softmax restricted to the selected set (the SPHERE code's router)."""
    top = logits.topk(k, dim=1)  # (N, K)
    weights = torch.softmax(top.values / temperature, dim=1)
    probs = torch.zeros_like(logits).scatter(1, top.indices, weights)
    mask = torch.zeros_like(logits, dtype=torch.bool).scatter(1, top.indices, True)
    return Routing(probs, mask, top.indices)


def dense_routing(logits: Tensor, k: int, temperature: float) -> Routing:
    """Softmax over all experts (Dense-MoE); ``k`` is ignored."""
    probs = torch.softmax(logits / temperature, dim=1)
    n, e = logits.shape
    mask = torch.ones(n, e, dtype=torch.bool, device=logits.device)
    indices = torch.arange(e, device=logits.device).expand(n, e)
    return Routing(probs, mask, indices)


def expert_choice_capacity(n_states: int, n_experts: int, k: int) -> int:
    """C = ceil(N*K/E) at capacity factor 1 (Zhou et al. 2022), never more than N."""
    return min(n_states, max(1, math.ceil(n_states * k / n_experts)))


def expert_choice_routing(logits: Tensor, k: int, temperature: float) -> Routing:
    """Expert choice (Zhou et al. 2022, arXiv:2202.09368) without dropping states.

    Each expert picks the C states of the batch with the highest softmax affinity. A state no expert
    picked is given its arg-max expert, so every state gets an output. The weights are a softmax of
    the logits over each state's selected set, so given the selection a state's output depends on
    that state alone (which keeps per-sample gradients, and hence the exact eNTK, well defined).
    The selection depends on the batch: with tiny batches (acting in one env) C can reach N, in
    which case every expert picks every state and the layer acts as a Dense-MoE.
    """
    n, e = logits.shape
    capacity = expert_choice_capacity(n, e, k)
    affinity = torch.softmax(logits.detach(), dim=1)  # (N, E)
    picks = affinity.topk(capacity, dim=0).indices  # (C, E)
    mask = torch.zeros(n, e, dtype=torch.bool, device=logits.device)
    mask.scatter_(0, picks, True)
    orphan = ~mask.any(dim=1)
    if orphan.any():
        mask[orphan, affinity[orphan].argmax(dim=1)] = True
    probs = torch.softmax((logits / temperature).masked_fill(~mask, float("-inf")), dim=1)
    return Routing(probs, mask, _indices_from_mask(mask, probs.detach()))


RouterFn = Callable[[Tensor, int, float], Routing]

#: Routers by network kind.
ROUTERS: dict[str, RouterFn] = {
    "topk": topk_routing,
    "ds": topk_routing,
    "dense_moe": dense_routing,
    "expert_choice": expert_choice_routing,
}


def make_dispatch(routing: Routing) -> Dispatch:
    """Sort the selected (state, expert) pairs by expert."""
    pairs = routing.mask.t().nonzero()  # (R, 2) as (expert, state), row-major so sorted by expert
    expert_idx, sample_idx = pairs[:, 0], pairs[:, 1]
    counts = tuple(routing.mask.sum(0).tolist())
    weight = routing.probs[sample_idx, expert_idx]
    return Dispatch(sample_idx, expert_idx, weight, counts, routing.mask.shape[0])


def full_dispatch(n_samples: int, n_experts: int, weight: Tensor) -> Dispatch:
    """Every state to every expert, expert-major; ``weight`` is (N, E)."""
    device = weight.device
    expert_idx = torch.arange(n_experts, device=device).repeat_interleave(n_samples)
    sample_idx = torch.arange(n_samples, device=device).repeat(n_experts)
    return Dispatch(sample_idx, expert_idx, weight.t().reshape(-1), (n_samples,) * n_experts, n_samples)
