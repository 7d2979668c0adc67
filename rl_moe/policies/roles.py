"""Roles: the networks a learner trains under one loss, with the optimizer that steps them.

A policy names its roles (``actor``, ``critic``) through :func:`policy_roles`; regularizers and
diagnostics get networks, parameters and optimizers from a :class:`Role` instead of looking
attributes up. rl_moe policies define ``roles()``; plain SB3 policies (``MlpPolicy`` for PPO,
``TD3Policy``) are read in their documented layout here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.td3.policies import TD3Policy
from torch import nn

@dataclass(frozen=True, eq=False)
class Role:
    """One trained side of a policy.

    :param name: ``actor`` or ``critic``
    :param networks: its networks: one for a PPO side, one per Q-network for TD3's critic; a plain
        SB3 actor-critic side is (its ``mlp_extractor`` branch, its output ``nn.Linear``)
    :param optimizer: the optimizer that steps them (PPO: the policy's single one)
    :param targets: TD3's Polyak-averaged copies of ``networks`` (empty for PPO)
    """

    name: str
    networks: tuple[nn.Module, ...]
    optimizer: torch.optim.Optimizer | None
    targets: tuple[nn.Module, ...] = ()

    @property
    def parameters(self) -> list[nn.Parameter]:
        """Trainable parameters of the role's networks (experts and gate; no log-std)."""
        return [p for net in self.networks for p in net.parameters() if p.requires_grad]


def sb3_roles(policy: nn.Module) -> dict[str, Role]:
    """The roles of a plain SB3 ``ActorCriticPolicy`` or ``TD3Policy``.

    :raises ValueError: for a policy of neither layout
    """
    if isinstance(policy, ActorCriticPolicy):
        extractor = policy.mlp_extractor
        return {
            "actor": Role("actor", (extractor.policy_net, policy.action_net), policy.optimizer),
            "critic": Role("critic", (extractor.value_net, policy.value_net), policy.optimizer),
        }
    if isinstance(policy, TD3Policy):
        actor, critic = policy.actor, policy.critic
        return {
            "actor": Role("actor", (actor.mu,), actor.optimizer, (policy.actor_target.mu,)),
            "critic": Role("critic", tuple(critic.q_networks), critic.optimizer, tuple(policy.critic_target.q_networks)),
        }
    raise ValueError(f"cannot find the roles of {type(policy).__name__}; valid choices: a rl_moe or SB3 PPO/TD3 policy")


@runtime_checkable
class HasRoles(Protocol):
    """A policy that lists its own roles (the rl_moe policies)."""

    def roles(self) -> dict[str, Role]: ...


def policy_roles(policy: Any) -> dict[str, Role]:
    """``{name: Role}`` of an rl_moe policy (its ``roles()``) or a plain SB3 PPO/TD3 policy."""
    return policy.roles() if isinstance(policy, HasRoles) else sb3_roles(policy)
