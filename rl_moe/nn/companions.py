"""Routed networks of the companion papers: SD-MoE experts and the SSMoE eigenvector router.

Both keep the Top-K gate and full-MLP experts of :class:`~rl_moe.nn.moe.RoutedMoE`; DSC, which
replaces the experts altogether, lives in :mod:`rl_moe.nn.dsc`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from rl_moe.nn.config import NetConfig
from rl_moe.nn.experts import StackedExperts
from rl_moe.nn.gate import GateMLP
from rl_moe.nn.moe import MoEOutput, RoutedMoE, balance_aux, run_routed
from rl_moe.nn.parts import NetworkParts
from rl_moe.nn.reuse import ScopedValue
from rl_moe.nn.routing import Routing, topk_routing
from rl_moe.nn.sdmoe import sdmoe_experts
from rl_moe.nn.ssmoe import gate_directions, input_embeddings, mixed_probs, ssmoe_routing
from rl_moe.nn.static import static_shapes_enabled


class SDMoE(RoutedMoE):
    """Top-K MoE whose experts are SD-MoE spectral stacks (:mod:`rl_moe.nn.sdmoe`): each expert
    layer is W_c + W_u^(i) (SD-MoE Eq. 8) with the gradient split of Eqs. 9-10. The router is the
    standard Top-K gate (SD-MoE §3.3: "follows the standard linear MoE router")."""

    def __init__(self, in_dim: int, out_dim: int, cfg: NetConfig, out_gain: float = 1.0) -> None:
        super().__init__(in_dim, out_dim, cfg, out_gain)
        self.experts = sdmoe_experts(cfg.n_experts, in_dim, out_dim, cfg, out_gain)


def ev_mixed_route(
    gate: GateMLP, experts: StackedExperts, x: Tensor, k: int, temperature: float, alpha: float, top_c: int,
    ev: ScopedValue[Tensor] | None = None,
) -> tuple[Tensor, Tensor, Routing]:
    """(gate embedding, logits, routing) of SSMoE's router P = alpha P_EV + (1 - alpha) P_R
    (SSMoE Algorithm 1). ``logits`` is log P, or the gate's own logits when alpha = 0, where the
    routing is exactly :func:`~rl_moe.nn.routing.topk_routing`.

    The EV router W_EV depends on the weights only and is a constant for autograd, as Algorithm 1
    pre-computes it; the logits x W_EV stay differentiable in x. It is built on every call (eigh of
    E in x in Grams, and the gate's pull-back), except that the calls of one
    :func:`~rl_moe.nn.reuse.weights_fixed` scope (a rollout, an evaluation) share ``ev``'s.
    """
    emb, logits = gate(x)  # (N, G), (N, E)
    if alpha == 0.0:
        return emb, logits, topk_routing(logits, k, temperature, static_shapes_enabled())

    def build() -> Tensor:
        with torch.no_grad():
            dirs = gate_directions(gate)  # (E, in) router embeddings r_i
            return input_embeddings(experts.layer_weights()[0], dirs, top_c)  # (E, in) = W_EV^T

    def sources() -> list[Tensor]:
        return [*gate.parameters(), *gate.buffers(), *experts.parameters(), *experts.buffers()]

    w_ev = build() if ev is None else ev.get(sources, build)
    # W_EV is constant, but x stays differentiable: a TD3 critic's dQ/da must see how the action
    # moves the EV router's weights, as it sees the gate's.
    mixed = mixed_probs(logits, x @ w_ev.T, temperature, alpha)  # (N, E)
    return emb, mixed.clamp_min(1e-30).log(), ssmoe_routing(mixed, k)


class SSMoE(RoutedMoE):
    """Top-K MoE trained with SSMoE's mixed router (:func:`ev_mixed_route`, :mod:`rl_moe.nn.ssmoe`).

    Same parameters as :class:`RoutedMoE` (the EV router has none)."""

    def __init__(self, in_dim: int, out_dim: int, cfg: NetConfig, out_gain: float = 1.0) -> None:
        super().__init__(in_dim, out_dim, cfg, out_gain)
        self._ev: ScopedValue[Tensor] = ScopedValue()

    def route(self, x: Tensor) -> tuple[Tensor, Tensor, Routing]:
        cfg = self.cfg
        return ev_mixed_route(self.gate, self.experts, x, cfg.top_k, cfg.temperature, cfg.ssmoe_alpha, cfg.ssmoe_top_c, self._ev)


class EVRerouted(NetworkParts, nn.Module):
    """A trained Top-K-routed network evaluated with SSMoE's mixed router, training-free (SSMoE
    §3: the EV router needs no training). Shares every parameter of ``net``.

    :param net: a :class:`RoutedMoE` with Top-K routing (``topk``, ``sdmoe``, ``ssmoe``)
    :param alpha: weight of the EV router
    :param top_c: eigenvectors per expert embedding
    """

    def __init__(self, net: RoutedMoE, alpha: float, top_c: int = 2) -> None:
        super().__init__()
        self.net, self.alpha, self.top_c = net, alpha, top_c
        self.n_experts, self.in_dim, self.out_dim = net.n_experts, net.in_dim, net.out_dim
        self._ev: ScopedValue[Tensor] = ScopedValue()

    @property
    def cfg(self) -> NetConfig:
        return self.net.cfg

    @property
    def experts(self) -> StackedExperts:
        return self.net.experts

    def gate_mlp(self) -> GateMLP:
        return self.net.gate

    def forward(self, x: Tensor) -> MoEOutput:
        cfg = self.net.cfg
        emb, logits, routing = ev_mixed_route(self.net.gate, self.net.experts, x, cfg.top_k, cfg.temperature, self.alpha, self.top_c, self._ev)
        out, group = run_routed(self.net.experts, x, routing)
        aux = balance_aux(logits, routing.mask)
        return MoEOutput(out, routing.probs, routing.indices, logits, emb, (group,), aux)
