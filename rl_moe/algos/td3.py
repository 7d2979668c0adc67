"""TD3 (Fujimoto et al. 2018, arXiv:1802.09477) with regularizer terms on the critic and actor losses."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from stable_baselines3 import TD3
from stable_baselines3.common.utils import polyak_update

from rl_moe.algos.common import RegularizedMixin
from rl_moe.regularizers.base import LossContext, Regularizer


class MoETD3(RegularizedMixin, TD3):
    """SB3 TD3 with regularizer hooks in both phases (``td3_critic`` and ``td3_actor``).

    :param policy: policy class or name (e.g. :class:`~rl_moe.policies.MoETD3Policy`)
    :param env: environment
    :param regularizers: objects implementing :class:`~rl_moe.regularizers.Regularizer`
    :param kwargs: any :class:`stable_baselines3.TD3` argument
    """

    def __init__(self, policy: Any, env: Any, regularizers: Sequence[Regularizer] = (), **kwargs: Any) -> None:
        self._init_regularizers(regularizers)
        super().__init__(policy, env, **kwargs)

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        self.policy.set_training_mode(True)
        self._update_learning_rate([self.actor.optimizer, self.critic.optimizer])
        actor_losses, critic_losses = [], []
        for _ in range(gradient_steps):
            self._n_updates += 1
            batch = self.replay_buffer.sample(batch_size, env=self._vec_normalize_env)  # type: ignore[union-attr]
            discounts = batch.discounts if batch.discounts is not None else self.gamma
            with torch.no_grad():
                noise = batch.actions.clone().normal_(0, self.target_policy_noise)
                noise = noise.clamp(-self.target_noise_clip, self.target_noise_clip)
                next_actions = (self.actor_target(batch.next_observations) + noise).clamp(-1, 1)
                next_q = torch.cat(self.critic_target(batch.next_observations, next_actions), dim=1)
                next_q = next_q.min(dim=1, keepdim=True).values
                target_q = batch.rewards + (1 - batch.dones) * discounts * next_q

            current_q = self.critic(batch.observations, batch.actions)
            critic_loss = sum(F.mse_loss(q, target_q) for q in current_q)
            critic_outs = getattr(self.critic, "last_outputs", [])
            ctx = LossContext(
                self, "td3_critic", batch, None, critic_outs[0] if critic_outs else None,
                losses={"critic": critic_loss}, extra={"critic_outputs": critic_outs},
            )
            critic_losses.append(critic_loss.item())
            self.critic.optimizer.zero_grad()
            self._backward(ctx, critic_loss, critic_loss.new_zeros(()), self.critic.parameters())
            self.critic.optimizer.step()
            self._after_update("td3_critic")

            if self._n_updates % self.policy_delay == 0:
                actor_loss = -self.critic.q1_forward(batch.observations, self.actor(batch.observations)).mean()
                ctx = LossContext(
                    self, "td3_actor", batch, getattr(self.actor, "last_output", None), None, losses={"actor": actor_loss}
                )
                actor_losses.append(actor_loss.item())
                self.actor.optimizer.zero_grad()
                self._backward(ctx, actor_loss, actor_loss.new_zeros(()), self.actor.parameters())
                self.actor.optimizer.step()
                self._after_update("td3_actor")
                polyak_update(self.critic.parameters(), self.critic_target.parameters(), self.tau)
                polyak_update(self.actor.parameters(), self.actor_target.parameters(), self.tau)
                polyak_update(self.critic_batch_norm_stats, self.critic_batch_norm_stats_target, 1.0)
                polyak_update(self.actor_batch_norm_stats, self.actor_batch_norm_stats_target, 1.0)

        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        if actor_losses:
            self.logger.record("train/actor_loss", np.mean(actor_losses))
        self.logger.record("train/critic_loss", np.mean(critic_losses))
        self._record_regularizer_logs()
