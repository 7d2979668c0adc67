"""MoE networks: gate + router + stacked experts, and the dense MLP baseline.

Every network maps (N, in) -> :class:`MoEOutput`, so policies, regularizers and diagnostics
treat dense and MoE networks alike (a dense MLP is one expert with weight 1).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor, nn

from rl_moe.nn.config import NetConfig
from rl_moe.nn.experts import ExpertPass, StackedExperts
from rl_moe.nn.gate import GateMLP
from rl_moe.nn.parts import NetworkParts
from rl_moe.nn.routing import ROUTERS, Dispatch, Routing, full_dispatch, make_dispatch, static_dispatch
from rl_moe.nn.static import static_shapes_enabled


class ExpertGroup(NamedTuple):
    """One stack of same-width experts and the rows routed to them."""

    dispatch: Dispatch
    expert: ExpertPass


class DSCLosses(NamedTuple):
    """DSC's auxiliary terms, summed over its branches (Eqs. 9, 11, 12; the signal S for Eq. 10)."""

    balance: Tensor  # () Eq. 9 load balance of the atom router
    frame: Tensor  # () Eq. 11 frame potential of the atoms
    z: Tensor  # () Eq. 12 router z-loss
    signal: Tensor  # (branches,) mean composition signal S per branch, for the Eq. 10 budget


class AuxLosses(NamedTuple):
    """Auxiliary losses a network computes on its own batch (None where it has none)."""

    load_balance: Tensor | None = None  # () Switch-style load balance of the gate (with autograd only)
    dsc: DSCLosses | None = None  # DSC's terms (with autograd only)


class MoEOutput(NamedTuple):
    """Everything a MoE layer exposes for the loss, the regularizers and the diagnostics."""

    out: Tensor  # (N, D) sum_e h_e * head_e(feat_e(x))
    probs: Tensor  # (N, E) routing weights of the routed experts, 0 when unselected
    indices: Tensor  # (N, K) selected routed experts, -1 padded
    logits: Tensor  # (N, E) gate logits
    gate_embedding: Tensor  # (N, G) last hidden layer of the gate
    groups: tuple[ExpertGroup, ...]  # expert stacks (DS-MoE has a shared and a routed one)
    aux: AuxLosses = AuxLosses()
    unbatched: bool = False  # the input was one observation (obs_dim,): phi() drops the batch axis too

    def feature_trace(self) -> Tensor | None:
        """tr(A_last) = sum_i ||phi_i||^2 / N, phi_i the routing-weighted last-hidden expert
        features of sample i (SPHERE's features, whose Gram trace ``train/sphere_trace`` logs), as
        a () tensor with no host read and no graph; None without expert stacks."""
        if not self.groups:
            return None
        n = self.groups[0].dispatch.n_samples
        total = sum((g.dispatch.weight.detach()[:, None] * g.expert.hidden[-1].detach()).square().sum() for g in self.groups)
        return total / n

    def phi(self, layer: int = -1, weighted: bool = True) -> Tensor:
        """Dense Phi (N, m): concatenated (routing-weighted) expert features of a hidden layer (SPHERE §4.4);
        ``(m,)`` for one unbatched observation, as ``out`` is ``(D,)``.

        Rows of unselected experts are zero. Only for small problems, tests and diagnostics: the
        SPHERE penalty works from the per-expert blocks directly.
        """
        blocks = []
        for group in self.groups:
            d, h = group.dispatch, group.expert.hidden[layer]  # h: (R, H)
            vals = h * d.weight[:, None] if weighted else h
            block = h.new_zeros(d.n_samples, d.n_experts, h.shape[1])
            block = block.index_put((d.sample_idx, d.expert_idx), vals)
            blocks.append(block.reshape(d.n_samples, -1))
        phi = torch.cat(blocks, dim=1)
        return phi[0] if self.unbatched else phi


def _combine(dispatch: Dispatch, expert_out: Tensor, out_dim: int) -> Tensor:
    if dispatch.static:  # expert-major (E*N, D): a weighted sum over the expert axis
        e, n = dispatch.n_experts, dispatch.n_samples
        return torch.einsum("en,end->nd", dispatch.weight.view(e, n), expert_out.view(e, n, out_dim))
    weighted = dispatch.weight[:, None] * expert_out  # (R, D)
    return expert_out.new_zeros(dispatch.n_samples, out_dim).index_add(0, dispatch.sample_idx, weighted)


def run_routed(experts: StackedExperts, x: Tensor, routing: Routing) -> tuple[Tensor, ExpertGroup]:
    """The experts on their routed rows: sorted segments (default) or, in static-shape mode
    (:mod:`rl_moe.nn.static`), every expert on every state with zero weight off the selected set."""
    if static_shapes_enabled():
        dispatch = static_dispatch(routing)
        ep = experts.forward_all(x)
    else:
        dispatch = make_dispatch(routing)
        ep = experts(x[dispatch.sample_idx], dispatch.counts, dispatch.expert_idx)
    return _combine(dispatch, ep.out, experts.out_dim), ExpertGroup(dispatch, ep)


def load_balance_loss(logits: Tensor, mask: Tensor) -> Tensor:
    """Switch-style E * sum_e f_e * P_e (Fedus et al. 2021); 1 at uniform routing."""
    n_experts = logits.shape[1]
    fraction = mask.float().mean(0) / mask.float().sum(1).mean().clamp_min(1.0)  # (E,) f_e, sums to 1
    mean_prob = torch.softmax(logits, dim=1).mean(0)  # (E,) P_e
    return n_experts * (fraction * mean_prob).sum()


def balance_aux(logits: Tensor, mask: Tensor) -> AuxLosses:
    """The gate's load-balance loss, as a forward with autograd exposes it; none without autograd
    (acting, evaluation, probes), where nothing reads it: the policy call at batch 8 took 0.92 of
    its time without them (benchmarks/acting_forward.py)."""
    return AuxLosses(load_balance=load_balance_loss(logits, mask)) if torch.is_grad_enabled() else AuxLosses()


class RoutedMoE(NetworkParts, nn.Module):
    """Top-K, Dense-MoE or expert-choice MoE over full-MLP experts."""

    def __init__(self, in_dim: int, out_dim: int, cfg: NetConfig, out_gain: float = 1.0) -> None:
        super().__init__()
        self.cfg, self.in_dim, self.out_dim = cfg, in_dim, out_dim
        self.n_experts = cfg.n_experts
        self.router = ROUTERS[cfg.kind]
        self.gate = GateMLP(in_dim, cfg.n_experts, cfg)
        self.experts = StackedExperts(cfg.n_experts, in_dim, cfg.hidden, out_dim, cfg.activation, cfg.layer_norm, out_gain)

    def gate_mlp(self) -> GateMLP:
        return self.gate

    def route(self, x: Tensor) -> tuple[Tensor, Tensor, Routing]:
        emb, logits = self.gate(x)
        return emb, logits, self.router(logits, self.cfg.top_k, self.cfg.temperature, static_shapes_enabled())

    def forward(self, x: Tensor) -> MoEOutput:
        emb, logits, routing = self.route(x)
        out, group = run_routed(self.experts, x, routing)
        aux = balance_aux(logits, routing.mask)
        return MoEOutput(out, routing.probs, routing.indices, logits, emb, (group,), aux)


def expert_param_count(in_dim: int, hidden: tuple[int, ...], out_dim: int, layer_norm: bool) -> int:
    dims = (in_dim, *hidden, out_dim)
    n = sum(a * b + b for a, b in zip(dims[:-1], dims[1:]))
    return n + (2 * sum(hidden) if layer_norm else 0)


def gate_param_count(in_dim: int, n_experts: int, cfg: NetConfig) -> int:
    dims = (in_dim, *cfg.gate_hidden)
    n = sum(a * b + b for a, b in zip(dims[:-1], dims[1:]))
    n += (2 * sum(cfg.gate_hidden)) if cfg.layer_norm else 0
    return n + dims[-1] * n_experts + n_experts


def ds_layout(in_dim: int, out_dim: int, cfg: NetConfig) -> tuple[int, int, tuple[int, ...]]:
    """DS-MoE split: (routed experts, routed top-k, routed hidden widths).

    Routed experts have width hidden/m; their number is chosen so the total parameter count
    matches the Top-K network with the same E, K. Active compute per state is n_shared full
    experts plus m*(K - n_shared) fine experts (at least one), as in DeepSeekMoE's fine-grained
    segmentation with shared-expert isolation (Dai et al. 2024, arXiv:2401.06066).
    """
    m = cfg.ds_granularity
    fine = tuple(h // m for h in cfg.hidden)
    full_p = expert_param_count(in_dim, cfg.hidden, out_dim, cfg.layer_norm)
    fine_p = expert_param_count(in_dim, fine, out_dim, cfg.layer_norm)
    target = cfg.n_experts * full_p + gate_param_count(in_dim, cfg.n_experts, cfg)
    budget = target - cfg.n_shared * full_p - gate_param_count(in_dim, 0, cfg)
    per_routed = fine_p + cfg.gate_hidden[-1] + 1 if cfg.gate_hidden else fine_p + in_dim + 1
    n_routed = max(1, round(budget / per_routed))
    routed_k = min(n_routed, max(1, m * (cfg.top_k - cfg.n_shared)))
    return n_routed, routed_k, fine


class DSMoE(NetworkParts, nn.Module):
    """DeepSeekMoE-style layer: always-active shared experts (weight 1 each) + fine routed experts.

    The shared experts' outputs are added with weight 1, as in DeepSeekMoE; routed experts use the
    Top-K subset softmax. ``probs``/``indices``/``logits`` describe the routed experts only.
    """

    def __init__(self, in_dim: int, out_dim: int, cfg: NetConfig, out_gain: float = 1.0) -> None:
        super().__init__()
        self.cfg, self.in_dim, self.out_dim = cfg, in_dim, out_dim
        self.n_experts, self.routed_k, fine = ds_layout(in_dim, out_dim, cfg)
        self.gate = GateMLP(in_dim, self.n_experts, cfg)
        self.experts = StackedExperts(self.n_experts, in_dim, fine, out_dim, cfg.activation, cfg.layer_norm, out_gain)
        self.shared = (
            StackedExperts(cfg.n_shared, in_dim, cfg.hidden, out_dim, cfg.activation, cfg.layer_norm, out_gain)
            if cfg.n_shared > 0
            else None
        )

    def expert_stacks(self) -> tuple[StackedExperts, ...]:
        return (self.experts,) if self.shared is None else (self.shared, self.experts)

    def gate_mlp(self) -> GateMLP:
        return self.gate

    def routed_top_k(self) -> int:
        return self.routed_k

    def route(self, x: Tensor) -> tuple[Tensor, Tensor, Routing]:
        emb, logits = self.gate(x)
        return emb, logits, ROUTERS["topk"](logits, self.routed_k, self.cfg.temperature, static_shapes_enabled())

    def forward(self, x: Tensor) -> MoEOutput:
        emb, logits, routing = self.route(x)
        out, group = run_routed(self.experts, x, routing)
        groups = [group]
        if self.shared is not None:
            n, s = x.shape[0], self.cfg.n_shared
            sd = full_dispatch(n, s, x.new_ones(n, s))
            sp = self.shared(x.repeat(s, 1), sd.counts, sd.expert_idx if s > 1 else None)
            out = out + _combine(sd, sp.out, self.out_dim)
            groups.insert(0, ExpertGroup(sd, sp))
        aux = balance_aux(logits, routing.mask)
        return MoEOutput(out, routing.probs, routing.indices, logits, emb, tuple(groups), aux)


class SoftMoE(NetworkParts, nn.Module):
    """Soft MoE (Puigcerver et al. 2023, arXiv:2308.00951) adapted to vector observations.

    Design: a learned linear tokenizer turns the observation into T = E tokens of width ``in_dim``;
    each expert owns one slot. Slot e is the softmax-over-tokens mix of the tokens (dispatch
    weights), expert e runs its full MLP on its slot, and each token takes the softmax-over-slots
    mix of the expert outputs (combine weights). The state's output is the mean over tokens, i.e.
    ``sum_e cbar_e * y_e`` with ``cbar_e`` the token-averaged combine weight, which is reported as
    ``probs``. Every expert is active for every state and nothing is dropped.
    """

    def __init__(self, in_dim: int, out_dim: int, cfg: NetConfig, out_gain: float = 1.0) -> None:
        super().__init__()
        self.cfg, self.in_dim, self.out_dim = cfg, in_dim, out_dim
        self.n_experts = e = cfg.n_experts
        self.tokenizer = nn.Linear(in_dim, e * in_dim)
        self.slot_keys = nn.Parameter(torch.randn(in_dim, e) / math.sqrt(in_dim))
        self.experts = StackedExperts(e, in_dim, cfg.hidden, out_dim, cfg.activation, cfg.layer_norm, out_gain)

    def router_rows(self) -> Tensor:
        return self.slot_keys.detach().T  # (E, in): each slot's key

    def forward(self, x: Tensor) -> MoEOutput:
        n, e, d = x.shape[0], self.n_experts, self.in_dim
        tokens = self.tokenizer(x).view(n, e, d)  # (N, T, d)
        scores = tokens @ self.slot_keys / self.cfg.temperature  # (N, T, E)
        dispatch_w = torch.softmax(scores, dim=1)  # over tokens
        combine_w = torch.softmax(scores, dim=2)  # over slots
        slots = torch.einsum("nte,ntd->end", dispatch_w, tokens)  # (E, N, d)
        probs = combine_w.mean(dim=1)  # (N, E)
        dispatch = full_dispatch(n, e, probs)
        if static_shapes_enabled():
            ep = self.experts.forward_all(slots)
        else:
            ep = self.experts(slots.reshape(e * n, d), dispatch.counts, dispatch.expert_idx)
        out = _combine(dispatch, ep.out, self.out_dim)
        mask = torch.ones_like(probs, dtype=torch.bool)
        indices = torch.arange(e, device=x.device).expand(n, e)
        aux = balance_aux(scores.mean(1), mask)
        return MoEOutput(out, probs, indices, scores.mean(1), tokens.mean(1), (ExpertGroup(dispatch, ep),), aux)


def dense_width(hidden: tuple[int, ...], multiplier: float) -> tuple[int, ...]:
    return tuple(max(1, round(h * multiplier)) for h in hidden)


def width_multiplier_for_params(in_dim: int, out_dim: int, hidden: tuple[int, ...], ratio: float) -> float:
    """Width multiplier giving about ``ratio`` times the dense network's parameters ("PPO(10x)")."""
    base = expert_param_count(in_dim, hidden, out_dim, False)
    lo, hi = 1.0, 64.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if expert_param_count(in_dim, dense_width(hidden, mid), out_dim, False) < ratio * base:
            lo = mid
        else:
            hi = mid
    return hi


class DenseMLP(NetworkParts, nn.Module):
    """Dense baseline with the experts' depth and width: one expert of weight 1."""

    def __init__(self, in_dim: int, out_dim: int, cfg: NetConfig, out_gain: float = 1.0) -> None:
        super().__init__()
        self.cfg, self.in_dim, self.out_dim = cfg, in_dim, out_dim
        self.n_experts = 1
        hidden = dense_width(cfg.hidden, cfg.width_multiplier)
        self.experts = StackedExperts(1, in_dim, hidden, out_dim, cfg.activation, cfg.layer_norm, out_gain)

    def forward(self, x: Tensor) -> MoEOutput:
        n = x.shape[0]
        ep = self.experts(x, (n,), None)
        ones = x.new_ones(n, 1)
        dispatch = Dispatch(torch.arange(n, device=x.device), x.new_zeros(n, dtype=torch.long), ones[:, 0], (n,), n)
        indices = torch.zeros(n, 1, dtype=torch.long, device=x.device)
        return MoEOutput(ep.out, ones, indices, x.new_zeros(n, 1), x.new_zeros(n, 0), (ExpertGroup(dispatch, ep),))
