"""What a regularizer acts on (target roles, expert stacks, hidden weight matrices); its settings
are built and checked in :mod:`rl_moe.regularizers.options`.

A regularizer targets *roles* (``actor`` or ``critic``; ``both`` = the two). The learner hands it,
per minibatch, the roles trained in the phase (:class:`~rl_moe.regularizers.hooks.RoleStep`: networks,
outputs, reference loss, parameters); lifecycle hooks get the policy's roles from
:func:`~rl_moe.policies.policy_roles`. The helpers here read the structure of a role's networks
(the per-network ones, :func:`hidden_weights` and :func:`expert_stacks`, live in :mod:`rl_moe.nn.specnorm`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from rl_moe.regularizers.hooks import PHASE_ROLES, Regularizer
from rl_moe.nn.specnorm import WeightRef, expert_stacks, hidden_weights
from rl_moe.policies import Role
from rl_moe.regularizers.options import build_config

#: ``target`` / ``placement`` values: the roles each one covers.
TARGETS: dict[str, tuple[str, ...]] = {"actor": ("actor",), "critic": ("critic",), "both": ("actor", "critic")}


def check_target(target: str, what: str = "target") -> tuple[str, ...]:
    """Roles of ``target``; ValueError naming the valid choices otherwise."""
    if target not in TARGETS:
        raise ValueError(f"unknown {what} {target!r}; valid choices: {', '.join(TARGETS)}")
    return TARGETS[target]


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


def term_name(base: str, roles: Sequence[str], role: str) -> str:
    """A penalty term's logged name: ``base`` when the method acts on one role, ``base_<role>``
    when it acts on both, so that the actor's and the critic's terms stay apart in the logger."""
    return base if len(roles) == 1 else f"{base}_{role}"


class Targeted(Regularizer):
    """A regularizer whose settings (its ``config_class``, with a ``target`` field) choose the
    roles it acts on: ``self.config`` and ``self.roles`` are built here for all of them.

    :param config: the settings (default: ``config_class()``); ``overrides`` replace some fields
    """

    def __init__(self, config: Any = None, **overrides: Any) -> None:
        self.config = build_config(self.config_class, config, overrides, self.name)
        self.roles = TARGETS[self.config.target]
