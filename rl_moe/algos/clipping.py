"""How PPO clips its gradients before the optimizer step, by name in :data:`GRAD_CLIPS`.

- ``joint``: SB3's rule, one global norm over every parameter of the policy (``clip_grad_norm_``
  over ``policy.parameters()``, bit-identical to SB3's PPO);
- ``separate``: the actor's and the critic's gradients are each clipped to ``max_grad_norm`` on
  their own, as the SPHERE authors' code does (two train states, each
  ``optax.chain(clip_by_global_norm, adam)``). Under ``joint`` a critic gradient of norm 10^4 scales
  the actor's update down by the same factor; under ``separate`` it cannot touch it.

One Adam over both halves steps exactly as two Adams would: Adam's state and step are
per element. The critic's side is its role's networks (:func:`rl_moe.policies.roles.policy_roles`:
the value network and its head) and, when the policy does not share it, its own features
extractor; everything else (the MoE actor, its gate, the log-std, a shared extractor) is the actor's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from stable_baselines3.common.policies import ActorCriticPolicy
from torch import Tensor, nn

from rl_moe.maths import grads_norm
from rl_moe.policies.roles import policy_roles


class ParamSplit(NamedTuple):
    """The trainable parameters of an actor-critic policy, by side."""

    actor: list[nn.Parameter]
    critic: list[nn.Parameter]


def split_actor_critic(policy: ActorCriticPolicy) -> ParamSplit:
    """The policy's trainable parameters split into the actor's and the critic's (module docstring)."""
    critic_ids = {id(p) for p in policy_roles(policy)["critic"].parameters}
    if not policy.share_features_extractor:
        critic_ids |= {id(p) for p in policy.vf_features_extractor.parameters()}
    params = [p for p in policy.parameters() if p.requires_grad]
    return ParamSplit([p for p in params if id(p) not in critic_ids], [p for p in params if id(p) in critic_ids])


def side_norm(params: Sequence[nn.Parameter], like: Tensor) -> Tensor:
    """Global L2 norm of the gradients of ``params`` (0 when none has one), on ``like``'s device."""
    return grads_norm(p.grad for p in params).to(like.device)


def _clip_joint(policy: ActorCriticPolicy, split: ParamSplit, max_norm: float) -> Tensor:
    """SB3's clipping; the two halves' norms come from the same per-tensor norms as the total.

    ``clip_grad_norm_`` takes the norm of the per-tensor norms (``_foreach_norm`` on one device and
    dtype); computing them once here and stacking them in parameter order gives the same total bit
    for bit, and the halves' norms for the logs without a second pass over the gradients (which
    cost 2% of an update, ``benchmarks/update_bookkeeping.py``).
    """
    params = [p for p in policy.parameters() if p.grad is not None]
    grads = [p.grad for p in params if p.grad is not None]
    like = next(policy.parameters())
    if not grads or len({(g.device, g.dtype) for g in grads}) > 1:  # mixed placement: two passes
        norms = torch.stack([side_norm(split.actor, like), side_norm(split.critic, like)])
        torch.nn.utils.clip_grad_norm_(policy.parameters(), max_norm)
        return norms
    per_tensor = torch._foreach_norm(grads, 2.0)
    total = torch.linalg.vector_norm(torch.stack(per_tensor))
    critic_ids = {id(p) for p in split.critic}
    halves = [[n for p, n in zip(params, per_tensor) if (id(p) in critic_ids) == is_critic] for is_critic in (False, True)]
    norms = torch.stack([torch.linalg.vector_norm(torch.stack(h)) if h else total.new_zeros(()) for h in halves])
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return norms.to(like.device)


def _clip_separate(policy: ActorCriticPolicy, split: ParamSplit, max_norm: float) -> Tensor:
    like = next(policy.parameters())
    norms = [torch.nn.utils.clip_grad_norm_(side, max_norm) if side else torch.zeros((), device=like.device) for side in split]
    return torch.stack(norms)


#: ``grad_clip`` name -> ``(policy, split, max_grad_norm) -> (2,) tensor`` of the actor's and the
#: critic's gradient norms before clipping.
GRAD_CLIPS: dict[str, Callable[[ActorCriticPolicy, ParamSplit, float], Tensor]] = {
    "joint": _clip_joint,
    "separate": _clip_separate,
}


def clip_gradients(policy: ActorCriticPolicy, rule: str, max_norm: float, split: ParamSplit | None = None) -> Tensor:
    """Clip the policy's gradients in place by ``rule`` (a key of :data:`GRAD_CLIPS`); return the
    (actor, critic) gradient norms before clipping, shape (2,). ``split``: the policy's
    :func:`split_actor_critic`, where the caller keeps it (it walks every parameter)."""
    return GRAD_CLIPS[rule](policy, split_actor_critic(policy) if split is None else split, max_norm)
