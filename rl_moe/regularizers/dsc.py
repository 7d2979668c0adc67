"""DSC auxiliary losses (dsc-dynamic-subspace-composition §2.5, Eqs. 9-13).

L = lambda_1 L_aux + lambda_2 L_budget + lambda_3 L_frame + lambda_z L_z (Eq. 13), with
L_aux = M sum_j P_j^2 (Eq. 9, load balance), L_budget = max(0, mu - mean S)^2 (Eq. 10, signal
preservation), L_frame the frame potential of the atom banks (Eq. 11) and L_z the squared
log-partition of the router logits (Eq. 12). The network computes them on the minibatch
(``MoEOutput.aux.dsc``, summed over its DSC branches; the budget per branch); this regularizer names,
weights and returns them. Defaults are the paper's App. A.3 settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rl_moe.regularizers.hooks import LossContext, Penalty
from rl_moe.regularizers.targets import Targeted, check_target, term_name

#: Term name -> aux key of the network output (the budget is computed here from ``dsc_signal``).
TERMS: tuple[str, ...] = ("balance", "budget", "frame", "z")


def budget_loss(signal: torch.Tensor, mu: float) -> torch.Tensor:
    """sum over branches of max(0, mu - mean_b S_b)^2 (Eq. 10); ``signal`` (L,) per-branch mean S."""
    return torch.relu(mu - signal).pow(2).sum()


@dataclass(frozen=True)
class DSCConfig:
    """DSC auxiliary-loss settings.

    :param balance: lambda_1 of the load-balance loss
    :param budget: lambda_2 of the budget loss
    :param mu: budget target mu
    :param frame: lambda_3 of the frame potential
    :param z: lambda_z of the logit-range loss
    :param target: ``actor`` (default), ``critic`` or ``both``; TD3 runs default to ``both`` since
        their critics carry the method's network (``AlgoSpec.regularizer_defaults`` in
        :mod:`rl_moe.continual.learners`)
    """

    balance: float = 0.01
    budget: float = 0.01
    mu: float = 1.0
    frame: float = 1e-3
    z: float = 1e-4
    target: str = "actor"

    def __post_init__(self) -> None:
        check_target(self.target)


class DSCAux(Targeted):
    """The four DSC auxiliary losses of every DSC network in the target roles."""

    name = "dsc"
    config_class = DSCConfig
    config: DSCConfig

    def __init__(self, config: DSCConfig | None = None, **overrides: Any) -> None:
        super().__init__(config, **overrides)
        cfg = self.config
        self.coefs = {"balance": cfg.balance, "budget": cfg.budget, "frame": cfg.frame, "z": cfg.z}

    @property
    def graph_safe(self) -> bool:
        return True

    def penalty(self, ctx: LossContext) -> list[Penalty]:
        terms = []
        for step in ctx.active(self.roles):
            outs = [out.aux.dsc for _, out in step.pairs() if out.aux.dsc is not None]
            if not outs:
                continue
            losses = {
                "balance": sum(o.balance for o in outs),
                "budget": sum(budget_loss(o.signal, self.config.mu) for o in outs),
                "frame": sum(o.frame for o in outs),
                "z": sum(o.z for o in outs),
            }
            terms += [Penalty(term_name(f"dsc_{t}", self.roles, step.role.name), losses[t], self.coefs[t]) for t in TERMS]
        return terms
