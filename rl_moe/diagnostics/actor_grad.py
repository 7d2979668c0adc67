"""Gradient of the actor loss for ``plasticity/grad_norm`` and the SD-MoE gradient subspaces.

PPO: the clipped surrogate plus the entropy term (SPHERE App. A.3's L_actor) on states sampled from the
latest rollout (advantages exist only there), evaluated right after collection, where the ratio is
1. TD3: -Q1(s, pi(s)) on the probe states. Gradients come from ``torch.autograd.grad``, so the
parameters' ``.grad`` and the optimizer are untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from stable_baselines3 import PPO
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.type_aliases import RolloutBufferSamples
from stable_baselines3.td3.policies import TD3Policy
from torch import Tensor

from rl_moe.algos.ppo_loss import ppo_losses
from rl_moe.algos.td3 import td3_actor_loss
from rl_moe.diagnostics.views import NetView
from rl_moe.maths import grads_norm
from rl_moe.nn import MoENetwork


class ActorGrad(NamedTuple):
    """Actor-loss gradient summary."""

    norm: float  # L2 norm over the actor network's parameters (log-std excluded)
    expert_grads: list[Tensor | None]  # per linear layer of the routed experts, (E, in, out)


def ppo_probe_loss(model: BaseAlgorithm, obs: Tensor, n_states: int, generator: torch.Generator) -> Tensor | None:
    """L_actor = clipped surrogate + ent_coef * entropy loss on up to ``n_states`` rollout samples."""
    if not isinstance(model, OnPolicyAlgorithm) or not model.rollout_buffer.full:
        return None
    buf = model.rollout_buffer
    size = buf.buffer_size * buf.n_envs
    idx = torch.randperm(size, generator=generator)[: min(n_states, size)].numpy()
    flat = lambda a: a.reshape(size, *a.shape[2:])[idx] if not buf.generator_ready else a[idx]
    device = model.policy.device
    batch = RolloutBufferSamples(
        *(torch.as_tensor(flat(a), device=device) for a in (buf.observations, buf.actions)),
        *(torch.as_tensor(flat(a), device=device).flatten() for a in (buf.values, buf.log_probs, buf.advantages, buf.returns)),
    )
    clip = model.clip_range(model._current_progress_remaining) if isinstance(model, PPO) else 0.2
    return ppo_losses(model, batch, clip, None).actor


def td3_probe_loss(model: BaseAlgorithm, obs: Tensor, n_states: int, generator: torch.Generator) -> Tensor | None:
    """-Q1(s, pi(s)) on the probe states."""
    policy = model.policy
    if not isinstance(policy, TD3Policy):
        return None
    return td3_actor_loss(policy.critic, obs, policy.actor(obs))


#: Actor losses by learner family.
ACTOR_LOSSES: dict[str, Callable[[BaseAlgorithm, Tensor, int, torch.Generator], Tensor | None]] = {
    "on_policy": ppo_probe_loss,
    "off_policy": td3_probe_loss,
}


def learner_family(model: BaseAlgorithm) -> str:
    return "on_policy" if isinstance(model, OnPolicyAlgorithm) else "off_policy"


def actor_grad(model: BaseAlgorithm, view: NetView, obs: Tensor, n_states: int = 256, seed: int = 0) -> ActorGrad | None:
    """Gradient of the actor loss w.r.t. the actor network (None when no loss is available yet)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.enable_grad():
        loss = ACTOR_LOSSES[learner_family(model)](model, obs, n_states, gen)
        if loss is None:
            return None
        params = [p for p in view.module.parameters() if p.requires_grad]
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    by_id = {id(p): g for p, g in zip(params, grads)}
    norm = float(grads_norm(g.detach().to(torch.float64) for g in grads if g is not None))
    weights = list(view.module.experts.weights) if isinstance(view.module, MoENetwork) else []
    return ActorGrad(norm, [by_id.get(id(w)) for w in weights])
