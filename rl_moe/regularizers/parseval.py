"""Parseval regularization (Chung et al. 2024, "Parseval regularization for continual RL", NeurIPS).

L = lambda * sum_l ||W_l W_l^T - s I||_F^2 over hidden layers, rows of W_l being output units.
Stacked expert weights (E, in, out) count as E separate matrices. The Gram is taken on the
smaller side: ||W W^T - s I||^2 = ||W^T W||^2 - 2 s ||W||_F^2 + s^2 * out (exact).

Choices: s defaults to gain^2 of the network's activation (2 for ReLU, as in the paper's public
code; (5/3)^2 for tanh); "hidden layers" are every expert layer but the head plus the gate's body
layers (the gate logits are an output), or every nn.Linear but the last of a plain network.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from rl_moe.regularizers.hooks import LossContext, Penalty
from rl_moe.nn.experts import ACTIVATION_GAINS
from rl_moe.nn.parts import MoENetwork
from rl_moe.policies import Role
from rl_moe.regularizers.targets import Targeted, WeightRef, check_target, role_hidden_weights, term_name


def parseval_loss(w: Tensor, scale: float) -> Tensor:
    """sum_e ||W_e W_e^T - s I||_F^2 for ``w`` (E, out, in) whose rows are output units."""
    out_dim, in_dim = w.shape[1], w.shape[2]
    gram = w @ w.transpose(1, 2) if out_dim <= in_dim else w.transpose(1, 2) @ w  # (E, k, k)
    return gram.pow(2).sum() - 2 * scale * w.pow(2).sum() + scale**2 * out_dim * w.shape[0]


def _activation_scale(role: Role) -> float:
    for net in role.networks:
        if isinstance(net, MoENetwork):
            return ACTIVATION_GAINS[net.cfg.activation] ** 2
    return 2.0


@dataclass(frozen=True)
class ParsevalConfig:
    """Parseval regularization settings.

    :param coef: lambda (the MetaWorld setting)
    :param scale: s; None = gain^2 of the activation (2 for ReLU)
    :param target: ``actor``, ``critic`` or ``both``
    """

    coef: float = 1e-3
    scale: float | None = None
    target: str = "actor"

    def __post_init__(self) -> None:
        check_target(self.target)


class Parseval(Targeted):
    """lambda * sum ||W W^T - s I||_F^2 over the target's hidden layers."""

    name = "parseval"
    config_class = ParsevalConfig
    config: ParsevalConfig

    def penalty(self, ctx: LossContext) -> list[Penalty]:
        terms = []
        for step in ctx.active(self.roles):
            refs: list[WeightRef] = role_hidden_weights(step.role)
            scale = self.config.scale if self.config.scale is not None else _activation_scale(step.role)
            loss = sum(parseval_loss(r.rows_out(), scale) for r in refs)
            terms.append(Penalty(term_name(self.name, self.roles, step.role.name), loss, self.config.coef))
        return terms
