"""What policies, regularizers and diagnostics may ask of a network: :class:`MoENetwork`.

Every network kind implements it (most through :class:`NetworkParts`), so consumers reach expert
stacks, the gate and the router rows through one typed surface instead of looking attributes up
by name. A module that is not a :class:`MoENetwork` (a plain SB3 ``nn.Sequential``) is treated
as a dense network without experts.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import Tensor

from rl_moe.nn.config import NetConfig
from rl_moe.nn.experts import StackedExperts
from rl_moe.nn.gate import GateMLP


@runtime_checkable
class MoENetwork(Protocol):
    """An rl_moe network: (N, in) -> :class:`~rl_moe.nn.MoEOutput`, and its parts.

    ``experts`` is the main expert stack (the routed one of DS-MoE, the trunk of DSC, the single
    expert of a dense MLP); ``n_experts`` is E of the learned router (1 when dense).
    """

    cfg: NetConfig
    n_experts: int

    @property
    def experts(self) -> StackedExperts: ...

    def expert_stacks(self) -> tuple[StackedExperts, ...]:
        """Every expert stack, in the order of ``MoEOutput.groups``."""
        ...

    def routed_experts(self) -> StackedExperts | None:
        """The stack the router chooses from, or None for a network with one expert."""
        ...

    def gate_mlp(self) -> GateMLP | None:
        """The learned gate, if the network has one."""
        ...

    def router_rows(self) -> Tensor | None:
        """Learned router rows (E, G), detached: the gate's logit layer, SoftMoE's slot keys."""
        ...

    def routed_top_k(self) -> int:
        """Experts per state the learned router selects (DS-MoE: its routed top-k)."""
        ...


class NetworkParts:
    """:class:`MoENetwork` for a network with one expert stack ``experts`` and no gate; a class
    with a gate, a second stack or other router rows overrides the matching method."""

    cfg: NetConfig
    n_experts: int
    experts: StackedExperts

    def expert_stacks(self) -> tuple[StackedExperts, ...]:
        return (self.experts,)

    def routed_experts(self) -> StackedExperts | None:
        return self.experts if self.experts.n_experts > 1 else None

    def gate_mlp(self) -> GateMLP | None:
        return None

    def router_rows(self) -> Tensor | None:
        gate = self.gate_mlp()
        return None if gate is None else gate.logits.weight.detach()

    def routed_top_k(self) -> int:
        return self.cfg.top_k
