"""SD-MoE basis refresh (sd-moe-spectral-decomposition §3.3).

The gradient split of Eqs. 9-10 happens inside the network (:class:`rl_moe.nn.sdmoe.SpectralExperts`);
what remains is the periodic SVD of W_c that keeps U_k, V_k the shared part's current top-k
singular vectors ("Since the basis for the common expert may change after update, we perform SVD
on W_c periodically"). This hook runs it every ``svd_every`` optimizer steps of each phase, on the
SD-MoE stacks of the networks that phase trains. It adds no loss term.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import nn

from rl_moe.nn.sdmoe import SpectralExperts
from rl_moe.policies import policy_roles
from rl_moe.regularizers.targets import Targeted, active_roles, check_target, expert_stacks

if TYPE_CHECKING:  # pragma: no cover
    from stable_baselines3.common.base_class import BaseAlgorithm


@dataclass(frozen=True)
class SDMoEConfig:
    """SD-MoE basis refresh settings.

    :param svd_every: optimizer steps between refreshes (the paper's 16)
    :param target: ``actor``, ``critic`` or ``both`` (default: every SD-MoE network there is)
    """

    svd_every: int = 16
    target: str = "both"

    def __post_init__(self) -> None:
        if self.svd_every < 1:
            raise ValueError(f"svd_every must be >= 1, got {self.svd_every}")
        check_target(self.target)


class SDRefresh(Targeted):
    """Refreshes SD-MoE's shared bases from an SVD of W_c."""

    name = "sdmoe"
    config_class = SDMoEConfig
    config: SDMoEConfig

    def __init__(self, config: SDMoEConfig | None = None, **overrides: Any) -> None:
        super().__init__(config, **overrides)
        self.steps: dict[str, int] = {}
        self.refreshes = 0

    def after_update(self, algo: "BaseAlgorithm", phase: str) -> None:
        self.steps[phase] = self.steps.get(phase, 0) + 1
        if self.steps[phase] % self.config.svd_every:
            return

        roles = policy_roles(algo.policy)
        for role in active_roles(phase, self.roles):
            for net in roles[role].networks:
                for stack in expert_stacks(net):
                    if isinstance(stack, SpectralExperts):
                        stack.refresh_bases()
                        self.refreshes += 1

    def logs(self) -> dict[str, float]:
        return {"sdmoe_refreshes": float(self.refreshes)}

    def state_dict(self, policy: nn.Module) -> dict[str, Any]:
        return {"steps": dict(self.steps), "refreshes": self.refreshes}

    def load_state_dict(self, state: dict[str, Any], policy: nn.Module) -> None:
        self.steps = {str(k): int(v) for k, v in state.get("steps", {}).items()}
        self.refreshes = int(state.get("refreshes", 0))
