"""Hidden units of stacked experts: activation statistics and resets (used by CBP and ReDo).

A hidden unit is (stack, layer l, expert e, unit i). Its input weights are column i of
``weights[l][e]`` (shape (in, out), used as ``x @ W``) with bias ``biases[l][e, i]`` (and LayerNorm
affine entries when present); its output weights are row i of ``weights[l + 1][e]``.

Resetting a unit also zeroes the Adam moments (``exp_avg``, ``exp_avg_sq``, ``max_exp_avg_sq``) of
exactly the touched entries, so a fresh unit is not driven by its predecessor's gradient history;
the optimizer's step counter is shared by the whole tensor and is left alone.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from rl_moe.nn import ExpertPass, StackedExperts
from rl_moe.nn.experts import ACTIVATION_GAINS
from rl_moe.nn.routing import Dispatch

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
