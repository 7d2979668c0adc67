"""L2 Init, regenerative regularization (Kumar, Marklund and Van Roy 2023, "Maintaining plasticity in
continual learning via regenerative regularization", arXiv:2308.11958).

L = lambda * ||theta - theta_0||^2 over the target role's parameters, theta_0 the parameters at
initialization, kept for the whole run (every task regularizes toward the same starting point); its
gradient is 2 lambda (theta - theta_0).

Choices: theta_0 is taken when the learner is built (before any update), over the role's
networks (experts and gate; SB3's log-std is not in a role). The paper sweeps lambda per
environment and states no single value; the default 1e-3 is ours.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rl_moe.regularizers.hooks import LossContext, Penalty
from rl_moe.policies import policy_roles
from rl_moe.regularizers.targets import Targeted, check_target, parameter_names, term_name


@dataclass(frozen=True)
class L2InitConfig:
    """L2 Init settings.

    :param coef: lambda
    :param target: ``actor``, ``critic`` or ``both``
    """

    coef: float = 1e-3
    target: str = "actor"

    def __post_init__(self) -> None:
        check_target(self.target)
        if self.coef < 0:
            raise ValueError(f"l2init coef must be >= 0, got {self.coef}")


class L2Init(Targeted):
    """lambda * ||theta - theta_0||^2 toward the initial parameters (Kumar et al. 2023)."""

    name = "l2init"
    config_class = L2InitConfig
    config: L2InitConfig

    def __init__(self, config: L2InitConfig | None = None, **overrides: Any) -> None:
        super().__init__(config, **overrides)
        self._init: dict[int, Tensor] = {}  # id(parameter) -> theta_0

    @property
    def graph_safe(self) -> bool:
        return True  # tensor ops on fixed copies: no host reads, nothing changes per minibatch

    def on_training_start(self, algo: Any) -> None:
        roles = policy_roles(algo.policy)
        for name in self.roles:
            for p in roles[name].parameters:
                self._init.setdefault(id(p), p.detach().clone())

    def penalty(self, ctx: LossContext) -> list[Penalty]:
        terms = []
        for step in ctx.active(self.roles):
            loss = sum(((p - self._init[id(p)]) ** 2).sum() for p in step.role.parameters)
            name = term_name(self.name, self.roles, step.role.name)
            terms.append(Penalty(name, torch.as_tensor(loss), self.config.coef))
        return terms

    def state_dict(self, policy: Any) -> dict[str, Any]:
        names = parameter_names(policy)
        return {"init": {names[key]: t.clone() for key, t in self._init.items() if key in names}}

    def load_state_dict(self, state: dict[str, Any], policy: Any) -> None:
        params = dict(policy.named_parameters())
        self._init = {id(params[name]): t.to(params[name]) for name, t in state["init"].items()}
