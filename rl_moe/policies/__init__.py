"""SB3 policies wrapping :mod:`rl_moe.nn` networks, and accessors for their torch modules."""

from __future__ import annotations

from torch import nn

from rl_moe.policies.networks import net_configs
from rl_moe.policies.ppo import MoEActorCritic, MoEActorCriticPolicy
from rl_moe.policies.td3 import MoETD3Actor, MoETD3Critic, MoETD3Policy


def actor_network(policy: nn.Module) -> nn.Module:
    """The actor's MoE/dense network (returns :class:`~rl_moe.nn.MoEOutput`) of a PPO or TD3 policy."""
    if isinstance(policy, MoEActorCriticPolicy):
        return policy.actor_net
    if isinstance(policy, MoETD3Policy):
        return policy.actor.net
    raise TypeError(f"not an rl_moe policy: {type(policy).__name__}; valid: MoEActorCriticPolicy, MoETD3Policy")


def critic_networks(policy: nn.Module) -> list[nn.Module]:
    """The critic network(s): the value network for PPO, the Q-networks for TD3."""
    if isinstance(policy, MoEActorCriticPolicy):
        return [policy.critic_net]
    if isinstance(policy, MoETD3Policy):
        return list(policy.critic.q_nets)
    raise TypeError(f"not an rl_moe policy: {type(policy).__name__}; valid: MoEActorCriticPolicy, MoETD3Policy")


__all__ = [
    "MoEActorCritic",
    "MoEActorCriticPolicy",
    "MoETD3Actor",
    "MoETD3Critic",
    "MoETD3Policy",
    "actor_network",
    "critic_networks",
    "net_configs",
]
