"""Spectral regularization (Lewandowski et al. 2025, "Learning continually by spectral regularization", ICLR).

L = lambda * sum_l (sigma_max(W_l)^2 - 1)^2 over hidden layers (stacked experts: per expert).
sigma_max comes from power iteration (:func:`rl_moe.maths.power_iteration`) with persistent vectors (one step per call, ten on the first
call), and sigma = u^T W v with u, v held constant is differentiable (its gradient is u v^T).

Choices: the target is 1 for every layer and biases are not regularised; the same hidden layers as
Parseval (expert layers but heads, gate body layers; plain nets: every Linear but the last).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rl_moe.regularizers.hooks import LossContext, Penalty
from rl_moe.maths import SingularPair, power_iteration, top_singular_value
from rl_moe.regularizers.targets import Targeted, check_target, parameter_names, role_hidden_weights, term_name


class PowerIteration:
    """Persistent left/right singular vectors of a stack of matrices (E, out, in)."""

    def __init__(self, w: Tensor) -> None:
        gen = torch.Generator(device="cpu").manual_seed(0)
        self.v = torch.randn(w.shape[0], w.shape[2], generator=gen).to(w)  # (E, in)
        self.v = self.v / self.v.norm(dim=1, keepdim=True)
        self.u = torch.zeros(w.shape[0], w.shape[1], dtype=w.dtype, device=w.device)  # (E, out)
        self.steps = 10

    def step(self, w: Tensor) -> None:
        self.u, self.v = power_iteration(w, SingularPair(self.u, self.v), self.steps)
        self.steps = 1

    def state(self) -> dict[str, Any]:
        return {"u": self.u.clone(), "v": self.v.clone(), "steps": self.steps}

    @classmethod
    def restore(cls, state: dict[str, Any], like: Tensor) -> "PowerIteration":
        """The iteration saved by :meth:`state`, on ``like``'s device and dtype."""
        it = cls.__new__(cls)
        it.u, it.v, it.steps = state["u"].to(like), state["v"].to(like), int(state["steps"])
        return it

    def sigma(self, w: Tensor) -> Tensor:
        """(E,) differentiable top singular values."""
        return top_singular_value(w, SingularPair(self.u, self.v))


def spectral_loss(w: Tensor, it: PowerIteration) -> Tensor:
    """sum_e (sigma_max(W_e)^2 - 1)^2 for ``w`` (E, out, in)."""
    it.step(w.detach())
    return (it.sigma(w).pow(2) - 1).pow(2).sum()


@dataclass(frozen=True)
class SpecRegConfig:
    """Spectral regularization settings.

    :param coef: lambda
    :param target: ``actor``, ``critic`` or ``both``
    """

    coef: float = 1e-4
    target: str = "actor"

    def __post_init__(self) -> None:
        check_target(self.target)


class SpectralReg(Targeted):
    """lambda * sum (sigma_max^2 - 1)^2 over the target's hidden layers."""

    name = "specreg"
    config_class = SpecRegConfig
    config: SpecRegConfig

    def __init__(self, config: SpecRegConfig | None = None, **overrides: Any) -> None:
        super().__init__(config, **overrides)
        self._iters: dict[int, PowerIteration] = {}

    def penalty(self, ctx: LossContext) -> list[Penalty]:
        terms = []
        for step in ctx.active(self.roles):
            loss = 0.0
            for ref in role_hidden_weights(step.role):
                w = ref.rows_out()  # (E, out, in)
                it = self._iters.setdefault(id(ref.tensor), PowerIteration(w))
                loss = loss + spectral_loss(w, it)
            terms.append(Penalty(term_name(self.name, self.roles, step.role.name), loss, self.config.coef))
        return terms

    def state_dict(self, policy: Any) -> dict[str, Any]:
        names = parameter_names(policy)
        return {"iterations": {names[key]: it.state() for key, it in self._iters.items() if key in names}}

    def load_state_dict(self, state: dict[str, Any], policy: Any) -> None:
        params = dict(policy.named_parameters())
        for name, saved in state["iterations"].items():
            self._iters[id(params[name])] = PowerIteration.restore(saved, params[name])
