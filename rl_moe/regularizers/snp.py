"""Shrink and perturb (Ash and Adams 2020, "On warm-starting neural network training", NeurIPS,
arXiv:1910.08475).

theta <- lambda * theta + sigma * eps at each task boundary (the paper's warm-start form), or every
``every_updates`` optimizer steps (the per-update variant some plasticity benchmarks run), over the
target role's parameters.

Choices: eps is Gaussian with each tensor's standard deviation at initialization, so the noise has
the scale of a fresh initialization of that tensor (tensors initialized constant, such as biases at
0, get none). The paper sweeps lambda and sigma; the defaults lambda = 0.4, sigma = 0.1 are ours.
Adam's moments are kept. The noise comes from a generator seeded by ``seed`` and the number of
applications, so a resumed run perturbs as the uninterrupted one does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rl_moe.regularizers.hooks import GRADIENT_STEP_PHASES, LossContext, Penalty
from rl_moe.policies import policy_roles
from rl_moe.regularizers.targets import Targeted, check_target, parameter_names


@dataclass(frozen=True)
class SNPConfig:
    """Shrink-and-perturb settings.

    :param shrink: lambda, the factor the parameters are multiplied by
    :param noise: sigma, the noise in units of each tensor's initial standard deviation
    :param every_updates: 0: at each task boundary (from the second task on); N: every N gradient
        steps (PPO's minibatch steps; TD3's critic steps, its delayed actor steps not counted)
    :param target: ``actor``, ``critic`` or ``both``
    :param seed: seed of the noise
    """

    shrink: float = 0.4
    noise: float = 0.1
    every_updates: int = 0
    target: str = "actor"
    seed: int = 0

    def __post_init__(self) -> None:
        check_target(self.target)
        if not 0.0 <= self.shrink <= 1.0:
            raise ValueError(f"snp shrink must lie in [0, 1], got {self.shrink}")
        if self.noise < 0 or self.every_updates < 0:
            raise ValueError(f"snp noise and every_updates must be >= 0, got {self.noise} and {self.every_updates}")


class ShrinkPerturb(Targeted):
    """Shrink the parameters toward 0 and add init-scaled noise (Ash & Adams 2020)."""

    name = "snp"
    config_class = SNPConfig
    config: SNPConfig

    def __init__(self, config: SNPConfig | None = None, **overrides: Any) -> None:
        super().__init__(config, **overrides)
        self._std: dict[int, float] = {}  # id(parameter) -> its standard deviation at initialization
        self.applied = 0
        self._updates = 0

    def penalty(self, ctx: LossContext) -> list[Penalty]:
        return []

    def on_training_start(self, algo: Any) -> None:
        roles = policy_roles(algo.policy)
        for name in self.roles:
            for p in roles[name].parameters:
                self._std.setdefault(id(p), float(p.detach().std()) if p.numel() > 1 else 0.0)

    def on_task_start(self, algo: Any, task_index: int) -> None:
        if self.config.every_updates == 0 and task_index > 0:
            self.apply(algo)

    def after_update(self, algo: Any, phase: str) -> None:
        if self.config.every_updates > 0 and phase in GRADIENT_STEP_PHASES:  # TD3's actor steps are not counted
            self._updates += 1
            if self._updates % self.config.every_updates == 0:
                self.apply(algo)

    @torch.no_grad()
    def apply(self, algo: Any) -> None:
        """theta <- shrink * theta + noise * std_0 * N(0, 1), for every target parameter."""
        gen = torch.Generator(device="cpu").manual_seed(self.config.seed * 1_000_003 + self.applied)
        roles = policy_roles(algo.policy)
        for name in self.roles:
            for p in roles[name].parameters:
                eps: Tensor = torch.randn(p.shape, generator=gen, dtype=p.dtype).to(p.device)
                p.mul_(self.config.shrink).add_(eps, alpha=self.config.noise * self._std.get(id(p), 0.0))
        self.applied += 1

    def logs(self) -> dict[str, float]:
        return {"snp_applied": float(self.applied)}

    def state_dict(self, policy: Any) -> dict[str, Any]:
        names = parameter_names(policy)
        return {"std": {names[k]: v for k, v in self._std.items() if k in names}, "applied": self.applied, "updates": self._updates}

    def load_state_dict(self, state: dict[str, Any], policy: Any) -> None:
        params = dict(policy.named_parameters())
        self._std = {id(params[name]): float(v) for name, v in state["std"].items()}
        self.applied, self._updates = int(state["applied"]), int(state["updates"])
