"""Switch-style load balancing (Fedus et al. 2021, arXiv:2101.03961, Eq. 4).

L = lambda * E * sum_e f_e P_e, f_e the fraction of routed (state, expert) pairs that go to e and
P_e the mean gate probability of e over the minibatch; 1 at uniform routing, its minimum. Read from
``MoEOutput.aux.load_balance`` (computed by the network on the training minibatch); networks
without a router (dense MLP) add nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from rl_moe.regularizers.hooks import LossContext, Penalty
from rl_moe.regularizers.targets import Targeted, check_target, term_name


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


class LoadBalance(Targeted):
    """Auxiliary load-balancing loss of the target's routers."""

    name = "load_balance"
    config_class = LoadBalanceConfig
    config: LoadBalanceConfig

    def penalty(self, ctx: LossContext) -> list[Penalty]:
        terms = []
        for step in ctx.active(self.roles):
            losses = [out.aux.load_balance for _, out in step.pairs() if out.aux.load_balance is not None]
            if losses:
                name = term_name(self.name, self.roles, step.role.name)
                terms.append(Penalty(name, sum(losses), self.config.coef))
        return terms
