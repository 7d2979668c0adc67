"""SB3 TD3 policy with MoE (or dense) actor and twin critics on obs ⊕ action (SPHERE Table 22)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from gymnasium import spaces
from stable_baselines3.common.policies import BaseModel, BasePolicy
from stable_baselines3.common.preprocessing import get_action_dim
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from stable_baselines3.common.type_aliases import PyTorchObs, Schedule
from stable_baselines3.td3.policies import TD3Policy
from torch import Tensor, nn

from rl_moe.nn import MoEOutput, NetConfig, build_network, track_in_eval
from rl_moe.policies.networks import fused_optimizer_kwargs, pop_net_configs
from rl_moe.policies.structure import GrowingPolicy
from rl_moe.policies.roles import Role


class ActorEval(NamedTuple):
    """Actions of the deterministic actor and its network's output."""

    actions: Tensor  # (B, act_dim) tanh-squashed
    output: MoEOutput


class MoETD3Actor(BasePolicy):
    """Deterministic actor a = tanh(net(obs).out)."""

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Box,
        features_extractor: nn.Module,
        features_dim: int,
        net_cfg: NetConfig,
        normalize_images: bool = True,
        **_sb3_mlp_args: Any,
    ) -> None:
        super().__init__(
            observation_space, action_space, features_extractor=features_extractor,
            normalize_images=normalize_images, squash_output=True,
        )
        self.features_dim, self.net_cfg = features_dim, net_cfg
        self.net = build_network(features_dim, get_action_dim(action_space), net_cfg, out_gain=1.0)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.update(features_dim=self.features_dim, net_cfg=self.net_cfg, features_extractor=self.features_extractor)
        return data

    def forward(self, obs: Tensor) -> Tensor:
        return self.forward_with_output(obs).actions

    def forward_with_output(self, obs: Tensor) -> ActorEval:
        """The actions and the network's :class:`MoEOutput` (for the regularizers)."""
        output = self.net(self.extract_features(obs, self.features_extractor))
        return ActorEval(torch.tanh(output.out), output)

    def _predict(self, observation: PyTorchObs, deterministic: bool = False) -> Tensor:
        return self(observation)


class MoETD3Critic(BaseModel):
    """``n_critics`` Q-networks on obs ⊕ action, each a MoE or dense network."""

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Box,
        features_extractor: BaseFeaturesExtractor,
        features_dim: int,
        net_cfg: NetConfig,
        normalize_images: bool = True,
        n_critics: int = 2,
        share_features_extractor: bool = False,
        **_sb3_mlp_args: Any,
    ) -> None:
        super().__init__(observation_space, action_space, features_extractor=features_extractor, normalize_images=normalize_images)
        self.share_features_extractor = share_features_extractor
        self.n_critics = n_critics
        in_dim = features_dim + get_action_dim(action_space)
        self.q_nets = nn.ModuleList(build_network(in_dim, 1, net_cfg, out_gain=1.0) for _ in range(n_critics))
        self.q_networks = list(self.q_nets)  # the attribute SB3 code reads

    def forward(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, ...]:
        return tuple(o.out for o in self.forward_with_outputs(obs, actions))

    def forward_with_outputs(self, obs: Tensor, actions: Tensor) -> tuple[MoEOutput, ...]:
        """Every Q-network's :class:`MoEOutput` (its ``out`` is Q) on obs ⊕ action."""
        # As in SB3: a shared extractor learns from the actor loss only.
        with torch.set_grad_enabled(not self.share_features_extractor):
            features = self.extract_features(obs, self.features_extractor)
        x = torch.cat([features, actions], dim=1)
        return tuple(q(x) for q in self.q_nets)

    def q1_forward(self, obs: Tensor, actions: Tensor) -> Tensor:
        with torch.no_grad():
            features = self.extract_features(obs, self.features_extractor)
        return self.q_nets[0](torch.cat([features, actions], dim=1)).out


class MoETD3Policy(GrowingPolicy, TD3Policy):
    """TD3 policy with MoE actor and/or MoE critics.

    ``TD3(MoETD3Policy, env, policy_kwargs=dict(moe="topk", n_experts=10, top_k=2))``.

    :param moe: network kind of the MoE side(s)
    :param actor_moe: MoE actor (default True)
    :param critic_moe: MoE critics (default True, as in the paper's TD3 experiment, Table 22)
    :param actor_cfg: full actor :class:`NetConfig` (overrides the flat arguments)
    :param critic_cfg: full critic :class:`NetConfig`
    :param arch: flat :class:`NetConfig` fields (``n_experts``, ``top_k``, ``hidden``, ...)
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Box,
        lr_schedule: Schedule,
        moe: str = "topk",
        actor_moe: bool = True,
        critic_moe: bool = True,
        actor_cfg: NetConfig | dict[str, Any] | None = None,
        critic_cfg: NetConfig | dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.actor_cfg, self.critic_cfg = pop_net_configs(kwargs, moe, actor_moe, critic_moe, actor_cfg, critic_cfg)
        super().__init__(observation_space, action_space, lr_schedule, **kwargs)

    def _build(self, lr_schedule: Schedule) -> None:
        self.optimizer_kwargs = fused_optimizer_kwargs(self.optimizer_class, self.optimizer_kwargs)
        super()._build(lr_schedule)
        # The targets stay in eval mode while Polyak averaging moves their weights: their spectral
        # norms (NetConfig.spectral_norm) keep their power iteration running.
        track_in_eval(self.actor_target)
        track_in_eval(self.critic_target)

    def make_actor(self, features_extractor: BaseFeaturesExtractor | None = None) -> MoETD3Actor:
        kwargs = self._update_features_extractor(self.actor_kwargs, features_extractor)
        return MoETD3Actor(net_cfg=self.actor_cfg, **kwargs).to(self.device)

    def make_critic(self, features_extractor: BaseFeaturesExtractor | None = None) -> MoETD3Critic:
        kwargs = self._update_features_extractor(self.critic_kwargs, features_extractor)
        return MoETD3Critic(net_cfg=self.critic_cfg, **kwargs).to(self.device)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.update(actor_cfg=self.actor_cfg.to_dict(), critic_cfg=self.critic_cfg.to_dict())
        # SB3 fills in its default net_arch; the configs above are what the networks are.
        for key in ("net_arch", "activation_fn"):
            data.pop(key, None)
        return data

    def replace_actor_network(self, wrap: Callable[[nn.Module], nn.Module]) -> None:
        """Put ``wrap(actor network)`` in its place for acting (the target copy keeps the trained
        network), e.g. an evaluation-time router sharing its parameters."""
        self.actor.net = wrap(self.actor.net)

    def roles(self) -> dict[str, Role]:
        """The actor network and the Q-networks, each side with its optimizer and target copies."""
        return {
            "actor": Role("actor", (self.actor.net,), self.actor.optimizer, (self.actor_target.net,)),
            "critic": Role("critic", tuple(self.critic.q_nets), self.critic.optimizer, tuple(self.critic_target.q_nets)),
        }
