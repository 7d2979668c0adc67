"""Switch-style load balancing (Fedus et al. 2021, arXiv:2101.03961, Eq. 4).

L = lambda * E * sum_e f_e P_e, f_e the fraction of routed (state, expert) pairs that go to e and
P_e the mean gate probability of e over the minibatch; 1 at uniform routing, its minimum. Read from
``MoEOutput.aux["load_balance"]`` (computed by the network on the training minibatch); networks
without a router (dense MLP) add nothing.
"""

from __future__ import annotations

from rl_moe.algos.hooks import LossContext, Penalty, Regularizer
from rl_moe.regularizers.targets import check_target


class LoadBalance(Regularizer):
    """Auxiliary load-balancing loss of the target's routers.

    :param coef: lambda (0.01, Switch Transformer's alpha)
    :param target: ``actor``, ``critic`` or ``both``
    """

    name = "load_balance"

    def __init__(self, coef: float = 0.01, target: str = "actor") -> None:
        self.coef = coef
        self.roles = check_target(target)

    def penalty(self, ctx: LossContext) -> list[Penalty]:
        terms = []
        for step in ctx.active(self.roles):
            losses = [out.aux["load_balance"] for _, out in step.pairs() if "load_balance" in out.aux]
            if losses:
                name = self.name if len(self.roles) == 1 else f"{self.name}_{step.role.name}"
                terms.append(Penalty(name, sum(losses), self.coef))
        return terms
