"""SB3 policies wrapping :mod:`rl_moe.nn` networks, their roles, and the forward passes the
learners use to get the networks' outputs along with the losses' inputs."""

from __future__ import annotations

from torch import Tensor, nn

from rl_moe.nn import MoEOutput
from rl_moe.policies.networks import net_configs
from rl_moe.policies.ppo import ActorCriticEval, MoEActorCritic, MoEActorCriticPolicy
from rl_moe.policies.roles import HasRoles, Role, policy_roles, sb3_roles
from rl_moe.policies.td3 import ActorEval, MoETD3Actor, MoETD3Critic, MoETD3Policy


def actor_network(policy: nn.Module) -> nn.Module:
    """The actor's MoE/dense network (returns :class:`~rl_moe.nn.MoEOutput`) of a PPO or TD3 policy."""
    if not isinstance(policy, HasRoles):
        raise TypeError(f"not an rl_moe policy: {type(policy).__name__}; valid: MoEActorCriticPolicy, MoETD3Policy")
    return policy.roles()["actor"].networks[0]


def critic_networks(policy: nn.Module) -> list[nn.Module]:
    """The critic network(s): the value network for PPO, the Q-networks for TD3."""
    if not isinstance(policy, HasRoles):
        raise TypeError(f"not an rl_moe policy: {type(policy).__name__}; valid: MoEActorCriticPolicy, MoETD3Policy")
    return list(policy.roles()["critic"].networks)


def evaluate_actions(policy: nn.Module, obs: Tensor, actions: Tensor) -> ActorCriticEval:
    """SB3's ``evaluate_actions`` with the actor's and critic's outputs (None for SB3's own policies)."""
    if isinstance(policy, MoEActorCriticPolicy):
        return policy.evaluate_actions_with_outputs(obs, actions)
    values, log_prob, entropy = policy.evaluate_actions(obs, actions)
    return ActorCriticEval(values, log_prob, entropy, None, None)


def act_with_output(actor: nn.Module, obs: Tensor) -> tuple[Tensor, MoEOutput | None]:
    """A TD3 actor's actions and its network's output (None for SB3's own actor)."""
    if isinstance(actor, MoETD3Actor):
        return actor.forward_with_output(obs)
    return actor(obs), None


def q_values_with_outputs(
    critic: nn.Module, obs: Tensor, actions: Tensor
) -> tuple[tuple[Tensor, ...], tuple[MoEOutput, ...]]:
    """Every Q-value of a TD3 critic and the Q-networks' outputs (empty for SB3's own critic)."""
    if isinstance(critic, MoETD3Critic):
        outputs = critic.forward_with_outputs(obs, actions)
        return tuple(o.out for o in outputs), outputs
    return tuple(critic(obs, actions)), ()


__all__ = [
    "ActorCriticEval",
    "ActorEval",
    "HasRoles",
    "MoEActorCritic",
    "MoEActorCriticPolicy",
    "MoETD3Actor",
    "MoETD3Critic",
    "MoETD3Policy",
    "Role",
    "act_with_output",
    "actor_network",
    "critic_networks",
    "evaluate_actions",
    "net_configs",
    "policy_roles",
    "q_values_with_outputs",
    "sb3_roles",
]
