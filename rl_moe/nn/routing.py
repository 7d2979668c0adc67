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
    """(state, expert) pairs of a routing, sorted by expert so each expert owns a contiguous slice.

    A *static* dispatch (:func:`static_dispatch`) holds every (state, expert) pair, expert-major,
    whatever the routing: its shapes never depend on the data, so it needs no host sync and can be
    captured in a CUDA graph. Unselected pairs have ``weight`` 0 and ``active`` 0.
    """

    sample_idx: Tensor  # (R,) long
    expert_idx: Tensor  # (R,) long, non-decreasing
    weight: Tensor  # (R,) routing weight h_{i,e}; differentiable w.r.t. the gate
    counts: tuple[int, ...]  # (E,) rows per expert
    n_samples: int
    active: Tensor | None = None  # (R,) float, 1 for routed pairs; None when every row is routed
    static: bool = False  # every pair present, R = E * N (see the class docstring)

    @property
    def n_experts(self) -> int:
        return len(self.counts)

    def row_scale(self, weighted: bool) -> Tensor | None:
        """(R,) per-row scale of the routing-weighted (``weighted``) or unweighted features."""
        return self.weight if weighted else self.active


def _indices_from_mask(mask: Tensor, probs: Tensor, width: int | None = None) -> Tensor:
    """Selected experts by decreasing weight, -1 padded to ``width`` (default: the largest set,
    which costs a host sync; the static path passes E)."""
    k = width if width is not None else (int(mask.sum(1).max().item()) if mask.numel() else 0)
    top = probs.masked_fill(~mask, -1.0).topk(max(k, 1), dim=1)
    return torch.where(top.values >= 0, top.indices, torch.full_like(top.indices, -1))


def topk_routing(logits: Tensor, k: int, temperature: float, static: bool = False) -> Routing:
    """Top-K with a softmax restricted to the selected set (the SPHERE code's router)."""
    top = logits.topk(k, dim=1)  # (N, K)
    weights = torch.softmax(top.values / temperature, dim=1)
    probs = torch.zeros_like(logits).scatter(1, top.indices, weights)
    mask = torch.zeros_like(logits, dtype=torch.bool).scatter(1, top.indices, True)
    return Routing(probs, mask, top.indices)


def dense_routing(logits: Tensor, k: int, temperature: float, static: bool = False) -> Routing:
    """Softmax over all experts (Dense-MoE); ``k`` is ignored."""
    probs = torch.softmax(logits / temperature, dim=1)
    n, e = logits.shape
    mask = torch.ones(n, e, dtype=torch.bool, device=logits.device)
    indices = torch.arange(e, device=logits.device).expand(n, e)
    return Routing(probs, mask, indices)


def expert_choice_capacity(n_states: int, n_experts: int, k: int) -> int:
    """C = ceil(N*K/E) at capacity factor 1 (Zhou et al. 2022), never more than N."""
    return min(n_states, max(1, math.ceil(n_states * k / n_experts)))


def expert_choice_routing(logits: Tensor, k: int, temperature: float, static: bool = False) -> Routing:
    """Expert choice (Zhou et al. 2022, arXiv:2202.09368) without dropping states.

    Each expert picks the C states of the batch with the highest softmax affinity. A state no expert
    picked is given its arg-max expert, so every state gets an output. The weights are a softmax of
    the logits over each state's selected set, so given the selection a state's output depends on
    that state alone (which keeps per-sample gradients, and hence the exact eNTK, well defined).
    The selection depends on the batch: with tiny batches (acting in one env) C can reach N, in
    which case every expert picks every state and the layer acts as a Dense-MoE. With ``static``
    the indices are padded to E columns so that no shape depends on the data.
    """
    n, e = logits.shape
    capacity = expert_choice_capacity(n, e, k)
    affinity = torch.softmax(logits.detach(), dim=1)  # (N, E)
    picks = affinity.topk(capacity, dim=0).indices  # (C, E)
    mask = torch.zeros(n, e, dtype=torch.bool, device=logits.device)
    mask.scatter_(0, picks, True)
    orphan = ~mask.any(dim=1, keepdim=True)  # (N, 1)
    # Without a data-dependent branch: orphans get their arg-max expert, others are unchanged.
    mask |= orphan & torch.nn.functional.one_hot(affinity.argmax(dim=1), e).bool()
    probs = torch.softmax((logits / temperature).masked_fill(~mask, float("-inf")), dim=1)
    return Routing(probs, mask, _indices_from_mask(mask, probs.detach(), e if static else None))


#: (logits, k, temperature, static) -> Routing; ``static`` asks for shapes independent of the data.
RouterFn = Callable[[Tensor, int, float, bool], Routing]

#: Routers by network kind. Each name is a network kind (:data:`~rl_moe.nn.config.NETWORK_KINDS`),
#: built as a :class:`~rl_moe.nn.moe.RoutedMoE` unless ``rl_moe.nn.build.NETWORKS`` gives it a
#: class of its own; a ``--method`` of that name is one more entry in the methods registry.
ROUTERS: dict[str, RouterFn] = {
    "topk": topk_routing,
    "ds": topk_routing,
    "sdmoe": topk_routing,
    "ssmoe": topk_routing,  # the gate's own router; SSMoE mixes it with the EV router
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
    return Dispatch(sample_idx, expert_idx, weight.t().reshape(-1), (n_samples,) * n_experts, n_samples, None, True)


def static_dispatch(routing: Routing) -> Dispatch:
    """Every (state, expert) pair, expert-major, weighted by the routing (0 when unselected).

    Shapes depend only on (N, E), so there is no ``nonzero``/``tolist`` host sync: the layout of
    the GPU path, where computing all E experts in one batched matmul beats sorting rows.
    """
    n, e = routing.probs.shape
    full = full_dispatch(n, e, routing.probs)
    return full._replace(active=routing.mask.t().reshape(-1).to(routing.probs.dtype))
