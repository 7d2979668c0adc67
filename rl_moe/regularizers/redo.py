"""ReDo: recycling dormant neurons (Sokar et al. 2023, arXiv:2302.12902, Eq. 1 and Alg. 1).

Score of unit i in a layer: s_i = E|h_i| / mean_j E|h_j|. A unit with s_i <= tau is dormant; every
``frequency`` gradient steps its input weights are re-drawn from the initial distribution, its
bias is zeroed and its outgoing weights are set to zero (so the network function is unchanged),
and the Adam moments of those entries are zeroed.

Choices: scores use the latest training minibatch; for MoE each expert is its own layer (its
mean over j runs over that expert's units, the expectation over the rows routed to it). An expert
that received no rows in that minibatch is left alone; one that got rows but whose layer is
silent throughout scores 0 and is recycled whole, as in the paper's code. Resets act on expert
hidden layers (every rl_moe network, the dense MLP included) and, with ``gate=True``, on the
gate's last hidden layer (its embedding, scored over all states; earlier gate layers are not
checked).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rl_moe.regularizers.hooks import LossContext
from rl_moe.maths import dormant_scores
from rl_moe.regularizers.targets import Targeted, active_roles, check_target
from rl_moe.regularizers.units import UnitLayer, UnitStats, unit_layers


def dormant_units(stats: UnitStats, tau: float) -> Tensor:
    """(E, H) bool: s_i <= tau (:func:`rl_moe.maths.dormant_scores`, per expert), False for idle experts."""
    return (dormant_scores(stats.mean_abs) <= tau) & (stats.rows > 0)[:, None]


@dataclass(frozen=True)
class ReDoConfig:
    """ReDo settings.

    :param tau: dormancy threshold (the paper's default setting)
    :param frequency: gradient steps between checks
    :param target: ``actor``, ``critic`` or ``both``
    :param gate: also recycle dormant units of the gate's last hidden layer
    """

    tau: float = 0.025
    frequency: int = 1000
    target: str = "actor"
    gate: bool = True

    def __post_init__(self) -> None:
        if self.frequency < 1:
            raise ValueError(f"frequency must be >= 1, got {self.frequency}")
        check_target(self.target)


class ReDo(Targeted):
    """Dormant-neuron recycling as a learner hook (no loss term)."""

    name = "redo"
    config_class = ReDoConfig
    config: ReDoConfig

    def __init__(self, config: ReDoConfig | None = None, **overrides: Any) -> None:
        super().__init__(config, **overrides)
        self._steps: dict[str, int] = {}
        #: Per role due for a check: (layer, statistics) pairs of the latest minibatch and the optimizer.
        self._pending: dict[str, tuple[list[tuple[UnitLayer, UnitStats]], list[Any]]] = {}
        self.n_reset = 0

    def observe(self, ctx: LossContext) -> None:
        for step in ctx.active(self.roles):
            role = step.role.name
            due = (self._steps.get(role, 0) + 1) % self.config.frequency == 0
            if due:  # only keep activations when a check follows this step
                layers = [pair for net, out in step.pairs() for pair in unit_layers(net, out, self.config.gate)]
                self._pending[role] = (layers, [step.role.optimizer] if step.role.optimizer is not None else [])

    def after_update(self, algo: Any, phase: str) -> None:
        for role in active_roles(phase, self.roles):
            self._steps[role] = self._steps.get(role, 0) + 1
            if self._steps[role] % self.config.frequency == 0:
                self.n_reset += self.recycle(*self._pending.pop(role, ([], [])))

    def recycle(self, layers: list[tuple[UnitLayer, UnitStats]], opts: list[Any]) -> int:
        """Reset every dormant unit of ``(layer, statistics)`` pairs; returns how many."""
        count = 0
        for units, stats in layers:
            mask = dormant_units(stats, self.config.tau)  # (E, H)
            for e in torch.nonzero(mask.any(dim=1)).flatten().tolist():
                idx = torch.nonzero(mask[e]).flatten()
                units.reinit(e, idx, opts)
                count += idx.numel()
        return count

    def logs(self) -> dict[str, float]:
        return {"redo_units_reset": float(self.n_reset)}

    def state_dict(self, policy: Any) -> dict[str, Any]:
        # Activations kept for a pending check are dropped: checkpoints fall between updates.
        return {"steps": dict(self._steps), "n_reset": self.n_reset}

    def load_state_dict(self, state: dict[str, Any], policy: Any) -> None:
        self._steps = {str(k): int(v) for k, v in state["steps"].items()}
        self.n_reset = int(state["n_reset"])
