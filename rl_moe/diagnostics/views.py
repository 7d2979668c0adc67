"""Uniform views of policy networks for the diagnostics: obs -> network input -> MoEOutput.

MoE networks already return :class:`~rl_moe.nn.MoEOutput`. Plain SB3 MLPs (``MlpPolicy``) are
wrapped by :class:`SequentialAsMoE`, which exposes them as one expert of weight 1, so the
plasticity metrics treat every policy alike and MoE-only metrics are skipped (``is_moe`` False).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from stable_baselines3.common.policies import ActorCriticPolicy
from torch import Tensor, nn

from rl_moe.nn import Dispatch, ExpertGroup, ExpertPass, MoENetwork, MoEOutput
from rl_moe.policies import HasRoles, Role, policy_roles

_NOT_ACTIVATIONS = (nn.Linear, nn.LayerNorm, nn.Dropout, nn.Flatten, nn.Identity)


class NetView(NamedTuple):
    """A network the probe can evaluate."""

    module: nn.Module  # parameter owner; module(inputs) -> MoEOutput
    inputs: Callable[[Tensor], Tensor]  # observation tensor (N, ...) -> network input (N, in)
    is_moe: bool  # has a router (E > 1); MoE-only metrics need it


class SequentialAsMoE(nn.Module):
    """Runs SB3 MLP layers and reports them as a single expert (E = 1) in a :class:`MoEOutput`.

    The output is the last ``nn.Linear``'s output (modules after it, e.g. TD3's final Tanh, are
    skipped: the eNTK uses the pre-squash mean, as for MoE actors).

    :param layers: the modules in order, e.g. ``[*policy_net, action_net]``
    """

    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        last = max(i for i, m in enumerate(layers) if isinstance(m, nn.Linear))
        self.layers = nn.ModuleList(layers[: last + 1])

    def forward(self, x: Tensor) -> MoEOutput:
        inputs, linear, pre, hidden, normed = [], [], [], [], []
        h = x
        for module in self.layers:
            if isinstance(module, nn.Linear):
                inputs.append(h)
                h = module(h)
                linear.append(h)
            elif isinstance(module, nn.LayerNorm):
                normed.append(nn.functional.layer_norm(h, module.normalized_shape, eps=module.eps))
                h = module(h)
            elif isinstance(module, _NOT_ACTIVATIONS):
                h = module(h)
            else:
                pre.append(h)
                h = module(h)
                hidden.append(h)
        n = x.shape[0]
        ones = x.new_ones(n, 1)
        arange = torch.arange(n, device=x.device)
        dispatch = Dispatch(arange, torch.zeros_like(arange), ones[:, 0], (n,), n)
        ep = ExpertPass(h, tuple(hidden), tuple(pre), tuple(inputs), tuple(linear), tuple(normed))
        indices = torch.zeros(n, 1, dtype=torch.long, device=x.device)
        return MoEOutput(h, ones, indices, x.new_zeros(n, 1), x.new_zeros(n, 0), (ExpertGroup(dispatch, ep),))


def _is_moe_net(module: nn.Module) -> bool:
    return isinstance(module, MoENetwork) and module.n_experts > 1


def _ppo_features(policy: nn.Module, obs: Tensor, critic: bool) -> Tensor:
    features = policy.extract_features(obs)
    if isinstance(features, tuple):
        return features[1] if critic else features[0]
    return features


def _td3_inputs(policy: nn.Module) -> Callable[[Tensor], Tensor]:
    actor = policy.actor
    return lambda obs: actor.extract_features(obs, actor.features_extractor)


def _q_inputs(policy: nn.Module) -> Callable[[Tensor], Tensor]:
    """obs -> critic features concatenated with the current deterministic action pi(s)."""
    critic, actor = policy.critic, policy.actor

    def inputs(obs: Tensor) -> Tensor:
        with torch.no_grad():
            action = actor(obs)
        return torch.cat([critic.extract_features(obs, critic.features_extractor), action], dim=1)

    return inputs


def _view(policy: nn.Module, role: Role, inputs: Callable[[Tensor], Tensor]) -> NetView:
    """The first network of ``role``: an rl_moe network as is, SB3's layers as one expert."""
    if isinstance(policy, HasRoles):
        net = role.networks[0]
        return NetView(net, inputs, _is_moe_net(net))
    # SB3 actor-critic: (mlp_extractor branch, output Linear); SB3 TD3: the Q/mu Sequential.
    layers = [*role.networks[0], *role.networks[1:]] if isinstance(policy, ActorCriticPolicy) else list(role.networks[0])
    return NetView(SequentialAsMoE(layers), inputs, False)


def actor_view(policy: nn.Module) -> NetView:
    """The actor mean network of a PPO (MoE or ``MlpPolicy``) or TD3 (MoE or SB3) policy.

    :param policy: an SB3 policy
    :raises ValueError: for a policy layout the diagnostics do not know
    """
    try:
        role = policy_roles(policy)["actor"]
    except ValueError:
        raise ValueError(
            f"unsupported policy {type(policy).__name__}; valid choices: MoEActorCriticPolicy, MoETD3Policy, "
            "SB3 ActorCriticPolicy, SB3 TD3Policy"
        ) from None
    inputs = (lambda obs: _ppo_features(policy, obs, False)) if isinstance(policy, ActorCriticPolicy) else _td3_inputs(policy)
    return _view(policy, role, inputs)


def critic_view(policy: nn.Module) -> NetView | None:
    """The value network (PPO) or the first Q-network at a = pi(s) (TD3); None when unknown."""
    try:
        role = policy_roles(policy)["critic"]
    except ValueError:
        return None
    inputs = (lambda obs: _ppo_features(policy, obs, True)) if isinstance(policy, ActorCriticPolicy) else _q_inputs(policy)
    return _view(policy, role, inputs)
