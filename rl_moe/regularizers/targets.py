"""What a regularizer acts on: target roles, expert stacks and hidden weight matrices.

A regularizer targets *roles* (``actor`` or ``critic``; ``both`` = the two). The learner hands it,
per minibatch, the roles trained in the phase (:class:`~rl_moe.algos.hooks.RoleStep`: networks,
outputs, reference loss, parameters); lifecycle hooks get the policy's roles from
:func:`~rl_moe.policies.policy_roles`. The helpers here read the structure of a role's networks
(the per-network ones, :func:`hidden_weights` and :func:`expert_stacks`, live in :mod:`rl_moe.nn.specnorm`).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from rl_moe.algos.hooks import PHASE_ROLES
from rl_moe.nn.specnorm import WeightRef, expert_stacks, hidden_weights
from rl_moe.policies import Role

ROLES: tuple[str, ...] = ("actor", "critic")
#: ``target`` / ``placement`` values: the roles each one covers.
TARGETS: dict[str, tuple[str, ...]] = {"actor": ("actor",), "critic": ("critic",), "both": ("actor", "critic")}


def check_target(target: str, what: str = "target") -> tuple[str, ...]:
    """Roles of ``target``; ValueError naming the valid choices otherwise."""
    if target not in TARGETS:
        raise ValueError(f"unknown {what} {target!r}; valid choices: {', '.join(TARGETS)}")
    return TARGETS[target]


def check_choice(value: Any, choices: tuple[Any, ...] | dict[Any, Any], what: str) -> None:
    if value not in choices:
        raise ValueError(f"unknown {what} {value!r}; valid choices: {', '.join(map(str, choices))}")


def active_roles(phase: str, roles: tuple[str, ...]) -> tuple[str, ...]:
    """The roles among ``roles`` trained in ``phase``."""
    return tuple(r for r in PHASE_ROLES.get(phase, ()) if r in roles)


def role_hidden_weights(role: Role, targets: bool = False) -> list[WeightRef]:
    """Hidden weights over all networks of a role (``targets``: of its TD3 target copies)."""
    nets = role.targets if targets else role.networks
    if len(nets) == 2 and isinstance(nets[1], nn.Linear) and not expert_stacks(nets[0]):
        # Plain SB3 actor-critic: (mlp_extractor branch, output Linear); the branch is all hidden.
        return [WeightRef(m, "weight", False) for m in nets[0].modules() if isinstance(m, nn.Linear)]
    return [r for n in nets for r in hidden_weights(n)]


def module_names(policy: nn.Module) -> dict[int, str]:
    """id(module) -> its qualified name in ``policy`` (regularizer state is saved by name)."""
    return {id(m): n for n, m in policy.named_modules()}


def parameter_names(policy: nn.Module) -> dict[int, str]:
    """id(parameter) -> its qualified name in ``policy``."""
    return {id(p): n for n, p in policy.named_parameters()}
