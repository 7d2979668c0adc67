"""Hidden units of MoE networks: activation statistics and resets (used by CBP and ReDo).

An expert hidden unit is (stack, layer l, expert e, unit i). Its input weights are column i of
``weights[l][e]`` (shape (in, out), used as ``x @ W[e]``) with bias ``biases[l][e, i]`` (and LayerNorm
affine entries when present); its output weights are row i of ``weights[l + 1][e]``. A gate hidden
unit is unit i of the gate's last body layer (the gate embedding): row i of that ``nn.Linear``
with its bias (and LayerNorm entries), and column i of the logits layer as output weights.
:class:`ExpertUnits` and :class:`GateUnits` give both the same interface, with E groups of units
for a stack and one group for the gate.

Resetting a unit also zeroes the Adam moments (``exp_avg``, ``exp_avg_sq``, ``max_exp_avg_sq``) of
exactly the touched entries, so a fresh unit is not driven by its predecessor's gradient history;
the optimizer's step counter is shared by the whole tensor and is left alone.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from rl_moe.nn import ExpertPass, GateMLP, MoENetwork, StackedExperts
from rl_moe.nn.experts import ACTIVATION_GAINS
from rl_moe.nn.routing import Dispatch
from rl_moe.regularizers.targets import expert_stacks

_MOMENTS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")


class UnitStats(NamedTuple):
    """Per-expert activation statistics of one hidden layer over the rows routed to each expert."""

    mean_abs: Tensor  # (E, H) mean |h| per expert; 0 where the expert got no rows
    mean: Tensor  # (E, H) mean h per expert
    rows: Tensor  # (E,) rows per expert


def layer_stats(dispatch: Dispatch, expert: ExpertPass, layer: int) -> UnitStats:
    """Segment means of hidden layer ``layer`` per expert (no Python loop over experts)."""
    h = expert.hidden[layer].detach()  # (R, H)
    n_exp = dispatch.n_experts
    rows = torch.tensor(dispatch.counts, dtype=h.dtype, device=h.device)  # (E,)
    sums = h.new_zeros(n_exp, h.shape[1]).index_add_(0, dispatch.expert_idx, h)  # (E, H)
    abs_sums = h.new_zeros(n_exp, h.shape[1]).index_add_(0, dispatch.expert_idx, h.abs())
    denom = rows.clamp_min(1.0)[:, None]
    return UnitStats(abs_sums / denom, sums / denom, rows)


def reset_moments(optimizers: list[Any], param: Tensor, index: tuple[Any, ...]) -> None:
    """Zero the Adam moments of ``param[index]`` in every optimizer that holds ``param``."""
    for opt in optimizers:
        state = opt.state.get(param)
        if not state:
            continue
        for key in _MOMENTS:
            if key in state and torch.is_tensor(state[key]) and state[key].shape == param.shape:
                state[key][index] = 0.0


def fresh_input_weights(stack: StackedExperts, layer: int) -> Tensor:
    """A new (in, out) matrix drawn like the stack's initialisation (orthogonal, activation gain)."""
    w = stack.weights[layer]
    fresh = torch.empty(w.shape[1], w.shape[2], dtype=w.dtype, device=w.device)
    nn.init.orthogonal_(fresh, gain=ACTIVATION_GAINS[stack.activation])
    return fresh


@torch.no_grad()
def reinit_units(stack: StackedExperts, layer: int, expert: int, units: Tensor, optimizers: list[Any]) -> None:
    """Fresh input weights, zero bias and zero output weights for ``units`` of one expert layer."""
    if units.numel() == 0:
        return
    w_in, b_in, w_out = stack.weights[layer], stack.biases[layer], stack.weights[layer + 1]
    w_in[expert][:, units] = fresh_input_weights(stack, layer)[:, units]
    b_in[expert][units] = 0.0
    w_out[expert][units, :] = 0.0
    touched: list[tuple[Tensor, tuple[Any, ...]]] = [
        (w_in, (expert, slice(None), units)),
        (b_in, (expert, units)),
        (w_out, (expert, units, slice(None))),
    ]
    if stack.layer_norm:
        stack.ln_weights[layer][expert][units] = 1.0
        stack.ln_biases[layer][expert][units] = 0.0
        touched += [(stack.ln_weights[layer], (expert, units)), (stack.ln_biases[layer], (expert, units))]
    for param, index in touched:
        reset_moments(optimizers, param, index)

def gate_stats(embedding: Tensor) -> UnitStats:
    """Statistics of the gate embedding (N, G) as one group of G units."""
    h = embedding.detach()
    rows = torch.full((1,), float(h.shape[0]), dtype=h.dtype, device=h.device)
    return UnitStats(h.abs().mean(0, keepdim=True), h.mean(0, keepdim=True), rows)


class ExpertUnits(NamedTuple):
    """Hidden layer ``layer`` of an expert stack: E groups of H units."""

    stack: StackedExperts
    layer: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.stack.n_experts, self.stack.hidden_dims[self.layer]

    def out_weights(self) -> Tensor:
        """(E, H, out) outgoing weights of every unit."""
        return self.stack.weights[self.layer + 1]

    @torch.no_grad()
    def add_to_next_bias(self, group: int, units: Tensor, mean: Tensor) -> None:
        """Add sum_i mean_i * w_out[i] to the next layer's bias (CBP's mean folding)."""
        w_out = self.out_weights()[group]  # (H, out)
        self.stack.biases[self.layer + 1][group] += (mean[:, None] * w_out[units, :]).sum(dim=0)

    def reinit(self, group: int, units: Tensor, optimizers: list[Any]) -> None:
        reinit_units(self.stack, self.layer, group, units, optimizers)


class GateUnits(NamedTuple):
    """The gate's last hidden layer (its embedding): one group of G units."""

    gate: GateMLP

    def _layers(self) -> tuple[nn.Linear, nn.LayerNorm | None, str]:
        body = list(self.gate.body)
        last = max(i for i, m in enumerate(body) if isinstance(m, nn.Linear))
        norm = body[last + 1] if isinstance(body[last + 1], nn.LayerNorm) else None
        return body[last], norm, body[-1].name  # type: ignore[return-value]

    @property
    def shape(self) -> tuple[int, int]:
        return 1, self.gate.logits.in_features

    def out_weights(self) -> Tensor:
        """(1, G, E) outgoing weights of every unit."""
        return self.gate.logits.weight.t()[None]

    @torch.no_grad()
    def add_to_next_bias(self, group: int, units: Tensor, mean: Tensor) -> None:
        """Add sum_i mean_i * w_out[i] to the logits' bias (CBP's mean folding)."""
        self.gate.logits.bias += (self.gate.logits.weight[:, units] * mean[None, :]).sum(dim=1)

    @torch.no_grad()
    def reinit(self, group: int, units: Tensor, optimizers: list[Any]) -> None:
        """Fresh input rows (orthogonal, activation gain), zero bias and zero logit columns."""
        if units.numel() == 0:
            return
        linear, norm, activation = self._layers()
        fresh = torch.empty_like(linear.weight)  # (G, in)
        nn.init.orthogonal_(fresh, gain=ACTIVATION_GAINS[activation])
        linear.weight[units] = fresh[units]
        linear.bias[units] = 0.0
        self.gate.logits.weight[:, units] = 0.0
        touched: list[tuple[Tensor, tuple[Any, ...]]] = [
            (linear.weight, (units,)),
            (linear.bias, (units,)),
            (self.gate.logits.weight, (slice(None), units)),
        ]
        if norm is not None:
            norm.weight[units] = 1.0
            norm.bias[units] = 0.0
            touched += [(norm.weight, (units,)), (norm.bias, (units,))]
        for param, index in touched:
            reset_moments(optimizers, param, index)


UnitLayer = ExpertUnits | GateUnits


def unit_layers(net: nn.Module, out: Any, gate: bool) -> list[tuple[UnitLayer, UnitStats]]:
    """Every resettable hidden layer of one network with its statistics on ``out`` (a MoEOutput)."""
    layers: list[tuple[UnitLayer, UnitStats]] = [
        (ExpertUnits(stack, layer), layer_stats(group.dispatch, group.expert, layer))
        for stack, group in zip(expert_stacks(net), out.groups)
        for layer in range(len(group.expert.hidden))
    ]
    g = net.gate_mlp() if isinstance(net, MoENetwork) else None
    if gate and g is not None and len(g.body) > 0:
        layers.append((GateUnits(g), gate_stats(out.gate_embedding)))
    return layers
