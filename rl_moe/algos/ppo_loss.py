"""The clipped PPO objective of one minibatch (Schulman et al. 2017, arXiv:1707.06347), as SB3
computes it; the one implementation, shared by the standard and the sync-free updates and by the
diagnostics (``plasticity/grad_norm``)."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from gymnasium import spaces
from stable_baselines3.common.type_aliases import RolloutBufferSamples
from torch import Tensor

from rl_moe.regularizers.hooks import LossContext, loss_context
from rl_moe.algos.learner import PPOLearner
from rl_moe.nn import MoEOutput
from rl_moe.policies import evaluate_actions


class PPOLosses(NamedTuple):
    """The loss terms of one minibatch, attached to the graph."""

    policy: Tensor  # () clipped surrogate loss
    value: Tensor  # () value loss
    entropy: Tensor  # () entropy loss (-mean entropy)
    actor: Tensor  # () policy + ent_coef * entropy: the reference loss of SPHERE's adaptive lambda
    ratio: Tensor  # (B,) pi / pi_old
    log_ratio: Tensor  # (B,) log pi - log pi_old
    actor_output: MoEOutput | None  # the actor network's output (None for SB3's own policies)
    critic_output: MoEOutput | None  # the value network's output

    def context(self, algo: PPOLearner, batch: RolloutBufferSamples, sync_free: bool = False) -> LossContext:
        """The regularizers' view of this minibatch: the actor's reference loss is L_actor, the
        critic's the value loss."""
        return loss_context(
            algo, "ppo", batch, {"actor": (self.actor_output,), "critic": (self.critic_output,)},
            {"actor": self.actor, "critic": self.value}, self.as_dict(), sync_free,
        )  # fmt: skip

    def as_dict(self) -> dict[str, Tensor]:
        """The terms under the names :class:`~rl_moe.regularizers.LossContext` uses."""
        return {"policy": self.policy, "value": self.value, "entropy": self.entropy, "actor": self.actor}

    def clip_fraction(self, clip_range: float | Tensor) -> Tensor:
        return torch.mean((torch.abs(self.ratio - 1) > clip_range).float())

    def approx_kl(self) -> Tensor:
        """The (r - 1) - log r estimator of KL(old || new) (Schulman's k3), without gradient."""
        with torch.no_grad():
            return torch.mean((torch.exp(self.log_ratio) - 1) - self.log_ratio)


def ppo_losses(
    algo: PPOLearner, batch: RolloutBufferSamples, clip_range: float | Tensor, clip_range_vf: float | Tensor | None
) -> PPOLosses:
    """PPO's losses on ``batch`` for the learner ``algo`` (its policy, ``ent_coef`` and
    ``normalize_advantage``), with SB3's operations in SB3's order so results match bit for bit."""
    actions = batch.actions
    if isinstance(algo.action_space, spaces.Discrete):
        actions = actions.long().flatten()
    values, log_prob, entropy, actor_output, critic_output = evaluate_actions(algo.policy, batch.observations, actions)
    values = values.flatten()
    advantages = batch.advantages
    if algo.normalize_advantage and len(advantages) > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    log_ratio = log_prob - batch.old_log_prob
    ratio = torch.exp(log_ratio)
    surrogate = torch.min(advantages * ratio, advantages * torch.clamp(ratio, 1 - clip_range, 1 + clip_range))
    policy_loss = -surrogate.mean()
    if clip_range_vf is None:
        values_pred = values
    else:
        values_pred = batch.old_values + torch.clamp(values - batch.old_values, -clip_range_vf, clip_range_vf)
    value_loss = F.mse_loss(batch.returns, values_pred)
    entropy_loss = torch.mean(log_prob) if entropy is None else -torch.mean(entropy)
    actor_loss = policy_loss + float(algo.ent_coef) * entropy_loss
    return PPOLosses(policy_loss, value_loss, entropy_loss, actor_loss, ratio, log_ratio, actor_output, critic_output)
