"""Switch-style load balancing (Fedus et al. 2021, arXiv:2101.03961, Eq. 4).

L = lambda * E * sum_e f_e P_e, f_e the fraction of routed (state, expert) pairs that go to e and
P_e the mean gate probability of e over the minibatch; 1 at uniform routing, its minimum. Read from
``MoEOutput.aux.load_balance`` (computed by the network on the training minibatch); networks
without a router (dense MLP) add nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rl_moe.algos.hooks import LossContext, Penalty, Regularizer
from rl_moe.regularizers.targets import TARGETS, build_config, check_target


@dataclass(frozen=True)
class LoadBalanceConfig:
    """Load-balancing loss settings.

    :param coef: lambda (Switch Transformer's alpha)
    :param target: ``actor``, ``critic`` or ``both``
    """

    coef: float = 0.01
    target: str = "actor"

    def __post_init__(self) -> None:
        check_target(self.target)


class LoadBalance(Regularizer):
    """Auxiliary load-balancing loss of the target's routers.

    :param config: the settings (default :class:`LoadBalanceConfig`); ``overrides`` replace some fields
    """

    name = "load_balance"
    config_class = LoadBalanceConfig

    def __init__(self, config: LoadBalanceConfig | None = None, **overrides: Any) -> None:
        self.config = build_config(LoadBalanceConfig, config, overrides, self.name)
        self.roles = TARGETS[self.config.target]

    def penalty(self, ctx: LossContext) -> list[Penalty]:
        terms = []
        for step in ctx.active(self.roles):
            losses = [out.aux.load_balance for _, out in step.pairs() if out.aux.load_balance is not None]
            if losses:
                name = self.name if len(self.roles) == 1 else f"{self.name}_{step.role.name}"
                terms.append(Penalty(name, sum(losses), self.config.coef))
        return terms
