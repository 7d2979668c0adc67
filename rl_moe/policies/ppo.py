"""SB3 actor-critic policy whose actor (and optionally critic) is a MoE network.

The actor network outputs the Gaussian mean directly (each expert has its own linear head), so
SB3's ``action_net`` is the identity (or :class:`BoundedMean`); the log-std is SB3's state-independent parameter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.type_aliases import Schedule
from torch import Tensor, nn

from rl_moe.nn import MoEOutput, NetConfig, build_network
from rl_moe.policies.networks import fused_optimizer_kwargs, pop_net_configs
from rl_moe.policies.roles import Role
from rl_moe.policies.structure import GrowingPolicy


def _action_out_dim(action_space: spaces.Space) -> int:
    if isinstance(action_space, spaces.Box):
        return int(torch.tensor(action_space.shape).prod())
    if isinstance(action_space, spaces.Discrete):
        return int(action_space.n)
    raise ValueError(f"unsupported action space {type(action_space).__name__}; valid choices: Box, Discrete")


class BoundedMean(nn.Module):
    """The Gaussian mean kept inside a Box action space: ``center + half_range * tanh(x)``.

    Only the mean is bounded; actions are still drawn from N(mean, std) and scored by the same
    Gaussian log-probability and entropy, so PPO's ratio and its entropy bonus are unchanged. A
    tanh-squashed Gaussian (SB3's ``SquashedDiagGaussianDistribution``) would also bound the
    samples, but changes the likelihood (its log-det term) and makes the entropy an estimate: two
    changes at once where the hypothesis under test is only the mean leaving the box
    (docs/results.md, §5).
    """

    def __init__(self, action_space: spaces.Space) -> None:
        super().__init__()
        if not isinstance(action_space, spaces.Box) or not np.all(np.isfinite(action_space.low)) or not np.all(np.isfinite(action_space.high)):
            raise ValueError(f"a bounded mean needs a Box action space with finite bounds; got {action_space}")
        low = torch.as_tensor(np.asarray(action_space.low, dtype=np.float32))
        high = torch.as_tensor(np.asarray(action_space.high, dtype=np.float32))
        self.register_buffer("center", (high + low) / 2)
        self.register_buffer("half_range", (high - low) / 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.center + self.half_range * torch.tanh(x)


class ActorCriticEval(NamedTuple):
    """SB3's ``evaluate_actions`` results plus the networks' full outputs (None for plain SB3 nets)."""

    values: Tensor  # (B, 1)
    log_prob: Tensor  # (B,)
    entropy: Tensor | None  # (B,)
    actor: MoEOutput | None
    critic: MoEOutput | None


class MoEActorCritic(nn.Module):
    """Actor and critic networks in SB3's ``mlp_extractor`` contract.

    ``forward_actor`` returns the action mean (or logits); ``forward_critic`` the value. Nothing is
    kept from a forward: the learner gets the full :class:`~rl_moe.nn.MoEOutput` from
    :meth:`MoEActorCriticPolicy.evaluate_actions_with_outputs`.
    """

    def __init__(self, features_dim: int, action_dim: int, actor_cfg: NetConfig, critic_cfg: NetConfig) -> None:
        super().__init__()
        self.actor_net = build_network(features_dim, action_dim, actor_cfg, out_gain=0.01)
        self.critic_net = build_network(features_dim, 1, critic_cfg, out_gain=1.0)
        self.latent_dim_pi, self.latent_dim_vf = action_dim, 1

    def forward(self, features: Tensor) -> tuple[Tensor, Tensor]:
        return self.forward_actor(features), self.forward_critic(features)

    def forward_actor(self, features: Tensor) -> Tensor:
        return self.actor_net(features).out

    def forward_critic(self, features: Tensor) -> Tensor:
        return self.critic_net(features).out


class MoEActorCriticPolicy(GrowingPolicy, ActorCriticPolicy):
    """PPO/A2C policy with a MoE actor and a dense or MoE critic.

    ``PPO(MoEActorCriticPolicy, env, policy_kwargs=dict(moe="topk", n_experts=10, top_k=2))``.

    :param moe: network kind (see :data:`rl_moe.nn.NETWORK_KINDS`)
    :param actor_moe: use a MoE actor (default) or a dense one
    :param critic_moe: use a MoE critic (default dense, as in the SPHERE paper's Algorithm 1)
    :param actor_cfg: full actor :class:`NetConfig` (overrides the flat arguments)
    :param critic_cfg: full critic :class:`NetConfig`
    :param bounded_mean: keep the Gaussian mean inside the action box (:class:`BoundedMean`)
    :param arch: flat :class:`NetConfig` fields shared by MoE sides: ``n_experts``, ``top_k``,
        ``hidden``, ``activation``, ``layer_norm``, ``temperature``, ``gate_hidden``, ...
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        lr_schedule: Schedule,
        moe: str = "topk",
        actor_moe: bool = True,
        critic_moe: bool = False,
        actor_cfg: NetConfig | dict[str, Any] | None = None,
        critic_cfg: NetConfig | dict[str, Any] | None = None,
        ortho_init: bool = False,
        bounded_mean: bool = False,
        **kwargs: Any,
    ) -> None:
        self.bounded_mean = bounded_mean
        self.actor_cfg, self.critic_cfg = pop_net_configs(kwargs, moe, actor_moe, critic_moe, actor_cfg, critic_cfg)
        # The networks carry their own init; SB3's ortho_init would overwrite the gate's gains.
        super().__init__(observation_space, action_space, lr_schedule, ortho_init=ortho_init, **kwargs)

    def _build_mlp_extractor(self) -> None:
        self.mlp_extractor = MoEActorCritic(
            self.features_dim, _action_out_dim(self.action_space), self.actor_cfg, self.critic_cfg
        )

    def _build(self, lr_schedule: Schedule) -> None:
        self.optimizer_kwargs = fused_optimizer_kwargs(self.optimizer_class, self.optimizer_kwargs)
        super()._build(lr_schedule)
        self.action_net = BoundedMean(self.action_space) if self.bounded_mean else nn.Identity()
        self.value_net = nn.Identity()
        # Rebuild: the base class made its optimizer over the linear heads just replaced.
        self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.update(actor_cfg=self.actor_cfg.to_dict(), critic_cfg=self.critic_cfg.to_dict(), bounded_mean=self.bounded_mean)
        for key in ("net_arch", "activation_fn"):
            data.pop(key, None)
        return data

    @property
    def actor_net(self) -> nn.Module:
        """The actor network (obs features -> :class:`MoEOutput` whose ``out`` is the mean)."""
        return self.mlp_extractor.actor_net

    @property
    def critic_net(self) -> nn.Module:
        """The critic network (obs features -> :class:`MoEOutput` whose ``out`` is V)."""
        return self.mlp_extractor.critic_net

    def replace_actor_network(self, wrap: Callable[[nn.Module], nn.Module]) -> None:
        """Put ``wrap(actor network)`` in its place, e.g. an evaluation-time router sharing its
        parameters (``python -m rl_moe.evaluate --router``)."""
        self.mlp_extractor.actor_net = wrap(self.mlp_extractor.actor_net)

    def roles(self) -> dict[str, Role]:
        """The actor and critic networks, both stepped by the policy's one optimizer."""
        return {
            "actor": Role("actor", (self.actor_net,), self.optimizer),
            "critic": Role("critic", (self.critic_net,), self.optimizer),
        }

    def evaluate_actions_with_outputs(self, obs: Tensor, actions: Tensor) -> ActorCriticEval:
        """:meth:`evaluate_actions` (SB3's operations in SB3's order) that also returns the actor's
        and critic's :class:`MoEOutput` on ``obs``, for the regularizers."""
        features = self.extract_features(obs)
        pi_features, vf_features = (features, features) if self.share_features_extractor else features
        actor = self.actor_net(pi_features)
        critic = self.critic_net(vf_features)
        distribution = self._get_action_dist_from_latent(actor.out)
        log_prob = distribution.log_prob(actions)
        values = self.value_net(critic.out)
        return ActorCriticEval(values, log_prob, distribution.entropy(), actor, critic)

    def evaluate_actions(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        values, log_prob, entropy, _, _ = self.evaluate_actions_with_outputs(obs, actions)
        return values, log_prob, entropy
