"""Expert orthogonality loss (geometric-regularization paper, Eq. 1).

L = lambda * sum_{i<j} <W~_i, W~_j>^2, W~_e = vec(W_e) / ||vec(W_e)|| the normalised flattened
first-layer weights of expert e. Each expert stack (DS-MoE: shared and routed) is its own set;
a stack with one expert (dense MLP) contributes 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from rl_moe.regularizers.hooks import LossContext, Penalty
from rl_moe.regularizers.targets import Targeted, check_target, expert_stacks, term_name


def orthogonality_loss(w: Tensor) -> Tensor:
    """sum_{i<j} <w_i, w_j>^2 of the normalised rows of ``w`` (E, ...) flattened."""
    flat = w.reshape(w.shape[0], -1)
    flat = flat / flat.norm(dim=1, keepdim=True).clamp_min(1e-12)  # (E, P)
    cos = flat @ flat.t()  # (E, E)
    return (cos.pow(2).sum() - cos.diagonal().pow(2).sum()) / 2


@dataclass(frozen=True)
class OrthoConfig:
    """Expert orthogonality settings.

    :param coef: lambda (the paper's cross-dataset setting)
    :param target: ``actor``, ``critic`` or ``both``
    """

    coef: float = 1e-3
    target: str = "actor"

    def __post_init__(self) -> None:
        check_target(self.target)


class Orthogonality(Targeted):
    """Pairwise squared cosine of the experts' first-layer weights."""

    name = "ortho"
    config_class = OrthoConfig
    config: OrthoConfig

    def penalty(self, ctx: LossContext) -> list[Penalty]:
        terms = []
        for step in ctx.active(self.roles):
            stacks = [s for net in step.role.networks for s in expert_stacks(net) if s.n_experts > 1]
            if not stacks:
                continue
            loss = sum(orthogonality_loss(s.weights[0]) for s in stacks)
            terms.append(Penalty(term_name(self.name, self.roles, step.role.name), loss, self.config.coef))
        return terms
