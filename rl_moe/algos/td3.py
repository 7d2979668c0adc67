"""TD3 (Fujimoto et al. 2018, arXiv:1802.09477) with regularizer terms on the critic and actor losses."""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F
from stable_baselines3 import TD3
from stable_baselines3.common.utils import polyak_update

from rl_moe.algos.backward import regularized_backward
from rl_moe.algos.common import DeviceTermLog, RegularizedMixin, after_step, record_update_logs
from rl_moe.algos.update import FAST_MODES
from rl_moe.regularizers.hooks import Regularizer, loss_context
from rl_moe.nn.reuse import weights_fixed
from rl_moe.nn.static import static_shapes
from rl_moe.policies import act_with_output, q_values_with_outputs


def td3_actor_loss(critic: torch.nn.Module, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """TD3's actor loss -mean Q1(s, pi(s)), ``actions`` = pi(s); the one implementation, shared
    with the diagnostics (``plasticity/grad_norm``)."""
    return -critic.q1_forward(obs, actions).mean()


class MoETD3(RegularizedMixin, TD3):
    """SB3 TD3 with regularizer hooks in both phases (``td3_critic`` and ``td3_actor``).

    The gradient steps of one ``train`` call never read the device: losses and regularizer terms
    are summed there and read once at the end. With the sync-free layout (``fast_update``), MoE
    layers also run with static shapes (:mod:`rl_moe.nn.static`), which on a GPU removes the
    routed dispatch's host syncs.

    A collection holds a :func:`~rl_moe.nn.reuse.weights_fixed` scope open, so its callbacks must
    not write weights other than in place through ordinary tensor ops (``load_state_dict``,
    ``copy_``): a ``.data`` write, a fused optimizer step or ``polyak_update`` is seen from the next
    collection on.

    :param policy: policy class or name (e.g. :class:`~rl_moe.policies.MoETD3Policy`)
    :param env: environment
    :param regularizers: objects implementing :class:`~rl_moe.regularizers.Regularizer`
    :param fast_update: ``auto`` (default): static-shape MoE layers on CUDA; ``on``: also on a
        CPU; ``off``: never (same maths either way)
    :param kwargs: any :class:`stable_baselines3.TD3` argument
    """

    def __init__(
        self, policy: Any, env: Any, regularizers: Sequence[Regularizer] = (), fast_update: str = "auto", **kwargs: Any
    ) -> None:
        if fast_update not in FAST_MODES:
            raise ValueError(f"unknown fast_update {fast_update!r}; valid choices: {', '.join(FAST_MODES)}")
        self.fast_update = fast_update
        self._dumped_at: int | None = None  # the step of SB3's last write of train/*
        self._init_regularizers(regularizers)
        super().__init__(policy, env, **kwargs)

    @property
    def static_layout(self) -> bool:
        """Whether MoE layers run with static shapes (the GPU layout) in this learner."""
        return self.fast_update == "on" or (self.fast_update == "auto" and self.device.type == "cuda")

    def collect_rollouts(self, *args: Any, **kwargs: Any) -> Any:
        # SB3 trains between collections, never inside one: a collection's calls may share the
        # values of the weights alone (rl_moe.nn.reuse).
        with static_shapes(self.static_layout), weights_fixed():
            return super().collect_rollouts(*args, **kwargs)

    def dump_logs(self) -> None:
        super().dump_logs()
        self._dumped_at = self.num_timesteps

    def flush_update_logs(self) -> None:
        """Write the last ``train`` call's pending ``train/*`` at the current step.

        SB3 writes TD3's logs only when an episode ends, so a task shorter than an episode would
        otherwise log nothing. If SB3 already wrote at this step, the values stay pending for its
        next write (writing them now would repeat the step).
        """
        if self.logger.name_to_value and self._dumped_at != self.num_timesteps:
            self.logger.dump(self.num_timesteps)
            self._dumped_at = self.num_timesteps

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        self.policy.set_training_mode(True)
        self._update_learning_rate([self.actor.optimizer, self.critic.optimizer])
        sums = torch.zeros(2, device=self.device)  # (critic, actor) loss sums of this call
        terms = DeviceTermLog()
        actor_steps = 0
        with static_shapes(self.static_layout):
            for _ in range(gradient_steps):
                self._n_updates += 1
                if self._gradient_step(batch_size, sums, terms):
                    actor_steps += 1
        critic_sum, actor_sum = sums.tolist()  # the one read of the call
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        if actor_steps:
            self.logger.record("train/actor_loss", actor_sum / actor_steps)
        self.logger.record("train/critic_loss", critic_sum / max(gradient_steps, 1))
        record_update_logs(self, terms.means())

    def _gradient_step(self, batch_size: int, sums: torch.Tensor, terms: DeviceTermLog) -> bool:
        """One critic step and, every ``policy_delay`` steps, an actor step with the target
        updates; losses are added to ``sums`` on the device. Returns whether the actor stepped."""
        batch = self.replay_buffer.sample(batch_size, env=self._vec_normalize_env)  # type: ignore[union-attr]
        discounts = batch.discounts if batch.discounts is not None else self.gamma
        with torch.no_grad():
            noise = batch.actions.clone().normal_(0, self.target_policy_noise)
            noise = noise.clamp(-self.target_noise_clip, self.target_noise_clip)
            next_actions = (self.actor_target(batch.next_observations) + noise).clamp(-1, 1)
            next_q = torch.cat(self.critic_target(batch.next_observations, next_actions), dim=1)
            next_q = next_q.min(dim=1, keepdim=True).values
            target_q = batch.rewards + (1 - batch.dones) * discounts * next_q

        current_q, critic_outs = q_values_with_outputs(self.critic, batch.observations, batch.actions)
        critic_loss = sum(F.mse_loss(q, target_q) for q in current_q)
        ctx = loss_context(self, "td3_critic", batch, {"critic": critic_outs}, {"critic": critic_loss}, {"critic": critic_loss})
        sums[0] += critic_loss.detach()
        self.critic.optimizer.zero_grad()
        regularized_backward(self.regularizers, ctx, critic_loss, critic_loss.new_zeros(()), self.critic.parameters(), terms)
        self.critic.optimizer.step()
        after_step(self, "td3_critic")

        if self._n_updates % self.policy_delay != 0:
            return False
        actions, actor_out = act_with_output(self.actor, batch.observations)
        actor_loss = td3_actor_loss(self.critic, batch.observations, actions)
        ctx = loss_context(self, "td3_actor", batch, {"actor": (actor_out,)}, {"actor": actor_loss}, {"actor": actor_loss})
        sums[1] += actor_loss.detach()
        self.actor.optimizer.zero_grad()
        regularized_backward(self.regularizers, ctx, actor_loss, actor_loss.new_zeros(()), self.actor.parameters(), terms)
        self.actor.optimizer.step()
        after_step(self, "td3_actor")
        # SB3's polyak_update writes in place, tensor by tensor: no copies, no host reads.
        polyak_update(self.critic.parameters(), self.critic_target.parameters(), self.tau)
        polyak_update(self.actor.parameters(), self.actor_target.parameters(), self.tau)
        polyak_update(self.critic_batch_norm_stats, self.critic_batch_norm_stats_target, 1.0)
        polyak_update(self.actor_batch_norm_stats, self.actor_batch_norm_stats_target, 1.0)
        return True
