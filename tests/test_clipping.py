"""PPO's gradient clipping rules (rl_moe.algos.clipping): the split of a policy into actor and
critic, the actor's step under ``separate`` against a huge critic loss, and the logged norms."""

from __future__ import annotations

import copy

import pytest
import torch

from rl_moe.algos import MoEPPO
from rl_moe.algos.clipping import clip_gradients, side_norm, split_actor_critic
from rl_moe.policies import MoEActorCriticPolicy
from tests.conftest import moe_ppo



def _ppo(policy=MoEActorCriticPolicy, **kwargs) -> MoEPPO:
    return moe_ppo(policy=None if policy is MoEActorCriticPolicy else policy, n_epochs=1, **kwargs)


@pytest.mark.parametrize("policy", ["MlpPolicy", MoEActorCriticPolicy])
def test_split_covers_every_parameter_once(policy) -> None:
    model = _ppo(policy)
    split = split_actor_critic(model.policy)
    ids_a, ids_c = {id(p) for p in split.actor}, {id(p) for p in split.critic}
    assert ids_a.isdisjoint(ids_c)
    assert ids_a | ids_c == {id(p) for p in model.policy.parameters()}
    p = model.policy
    assert id(p.log_std) in ids_a
    critic_net = p.critic_net if policy is MoEActorCriticPolicy else p.mlp_extractor.value_net
    actor_net = p.actor_net if policy is MoEActorCriticPolicy else p.mlp_extractor.policy_net
    assert {id(q) for q in critic_net.parameters()} <= ids_c
    assert {id(q) for q in actor_net.parameters()} <= ids_a


def _actor_after_one_step(model: MoEPPO, state: dict, batch, grad_clip: str, vf_coef: float) -> list[torch.Tensor]:
    """The actor's parameters after one minibatch step from ``state`` with the given rule."""
    model.policy.load_state_dict(state["policy"])
    model.policy.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
    model.grad_clip, model.vf_coef = grad_clip, vf_coef
    model._updater().step(batch, 0.2, None, sync_free=False)
    return [p.detach().clone() for p in split_actor_critic(model.policy).actor]


def test_separate_clipping_keeps_a_huge_critic_loss_out_of_the_actor_step() -> None:
    model = _ppo()
    model.learn(128)  # Adam state past its first step, and a rollout to draw a minibatch from
    state = {"policy": copy.deepcopy(model.policy.state_dict()), "optimizer": copy.deepcopy(model.policy.optimizer.state_dict())}
    batch = next(model.rollout_buffer.get(32))
    without_critic = _actor_after_one_step(model, state, batch, "separate", 0.0)
    huge = _actor_after_one_step(model, state, batch, "separate", 1e6)
    for a, b in zip(without_critic, huge):
        assert torch.equal(a, b)
    # Joint clipping divides the actor's gradient by the critic's norm: its step all but vanishes.
    model.policy.load_state_dict(state["policy"])
    before = [p.detach().clone() for p in split_actor_critic(model.policy).actor]
    joint = _actor_after_one_step(model, state, batch, "joint", 1e6)
    step_sep = torch.cat([(a - b).flatten() for a, b in zip(huge, before)]).norm()
    step_joint = torch.cat([(a - b).flatten() for a, b in zip(joint, before)]).norm()
    assert step_sep > 0
    assert step_joint < 0.5 * step_sep


@pytest.mark.parametrize("grad_clip", ["joint", "separate"])
def test_logged_norms_are_the_sides_norms_before_clipping(grad_clip: str) -> None:
    model = _ppo(grad_clip=grad_clip)
    model.learn(128)
    batch = next(model.rollout_buffer.get(32))
    loss = model.policy.evaluate_actions(batch.observations, batch.actions)
    model.policy.optimizer.zero_grad()
    (loss[0].pow(2).mean() * 100 - loss[1].mean()).backward()
    split = split_actor_critic(model.policy)
    like = split.actor[0]
    expect = torch.stack([side_norm(split.actor, like), side_norm(split.critic, like)])
    joint_norm = expect.norm()
    norms = clip_gradients(model.policy, model.grad_clip, model.max_grad_norm)
    torch.testing.assert_close(norms, expect)
    after = torch.stack([side_norm(split.actor, like), side_norm(split.critic, like)])
    if grad_clip == "separate":  # each side on its own
        torch.testing.assert_close(after, torch.clamp(expect, max=model.max_grad_norm), rtol=1e-5, atol=0)
    else:  # one factor for both
        torch.testing.assert_close(after, expect * min(1.0, model.max_grad_norm / float(joint_norm)), rtol=1e-5, atol=0)


def test_update_logs_both_norms_and_unknown_rule_is_refused() -> None:
    model = _ppo(grad_clip="separate")
    model.learn(128)
    logged = model.logger.name_to_value
    assert logged["train/grad_norm_actor"] > 0 and logged["train/grad_norm_critic"] > 0
    with pytest.raises(ValueError, match="grad_clip 'both'.*joint, separate"):
        _ppo(grad_clip="both")
