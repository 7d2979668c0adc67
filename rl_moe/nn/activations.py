"""Activation functions by name (``NetConfig.activation``): the function, its orthogonal init gain
and how many features it makes of each pre-activation unit.

Two of them widen a layer. ``crelu`` (concatenated ReLU; Shang et al. 2016, used against loss of
plasticity by Abbas et al. 2023, "Loss of plasticity in continual deep reinforcement learning",
arXiv:2303.07507) maps z to [relu(z), relu(-z)]; ``fourier`` (deep Fourier features; Lewandowski
et al. 2024, "Plastic learning with deep Fourier features", arXiv:2410.20634) maps z to
[sin(z), cos(z)]. A linear layer of width H then feeds 2H features to the next layer: the
configured widths are the linear layers' output widths, as in both papers, which replace the
activation of an unchanged network (so the layer after it has twice the inputs and about twice
the weights). Where LayerNorm is on, it normalizes z, before the activation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor


def crelu(z: Tensor) -> Tensor:
    """[relu(z), relu(-z)] along the last axis: (..., H) -> (..., 2H)."""
    return torch.cat((F.relu(z), F.relu(-z)), dim=-1)


def fourier(z: Tensor) -> Tensor:
    """[sin(z), cos(z)] along the last axis: (..., H) -> (..., 2H)."""
    return torch.cat((torch.sin(z), torch.cos(z)), dim=-1)


def _identity(rows: Tensor) -> Tensor:
    return rows


def _crelu_rows(rows: Tensor) -> Tensor:
    half = rows.shape[-1] // 2
    return rows[..., :half] - rows[..., half:]  # relu(z) -> z, relu(-z) -> -z


def _fourier_rows(rows: Tensor) -> Tensor:
    return rows[..., : rows.shape[-1] // 2]  # the linear part at 0: sin(z) -> z, cos(z) -> 1


class Activation(NamedTuple):
    """One activation choice.

    :param fn: the elementwise map, (..., H) -> (..., width * H)
    :param gain: orthogonal init gain of the linear layers before it
    :param width: features per pre-activation unit
    :param pull_back: rows (..., width * H) in feature space -> (..., H) in pre-activation space,
        through the activation's linear part (ReLU taken as the identity, as the linear pull-backs
        of the diagnostics drop activations; :func:`rl_moe.nn.ssmoe.gate_directions`)
    """

    fn: Callable[[Tensor], Tensor]
    gain: float
    width: int = 1
    pull_back: Callable[[Tensor], Tensor] = _identity


#: Activation name -> :class:`Activation`. CReLU keeps ReLU's gain sqrt(2) (each half is a ReLU);
#: Fourier features take gain 1 (sin and cos are unit-slope at 0 and bounded: Lewandowski et al.
#: leave the initialisation to the base network; this choice is ours).
ACTIVATION_SPECS: dict[str, Activation] = {
    "relu": Activation(F.relu, math.sqrt(2.0)),
    "tanh": Activation(torch.tanh, 5.0 / 3.0),
    "crelu": Activation(crelu, math.sqrt(2.0), 2, _crelu_rows),
    "fourier": Activation(fourier, 1.0, 2, _fourier_rows),
}


def feature_widths(hidden: tuple[int, ...], activation: str) -> tuple[int, ...]:
    """The widths of the hidden features (post-activation) of layers of widths ``hidden``."""
    return tuple(h * ACTIVATION_SPECS[activation].width for h in hidden)
