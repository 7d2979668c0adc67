"""Plasticity injection (Nikishin et al. 2023) and reset (Nikishin et al. 2022): known answers,
the grown network through the optimizer, both clipping rules and checkpoints, and CLI runs."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest
import torch

from rl_moe.algos.clipping import split_actor_critic
from rl_moe.crl import main
from rl_moe.nn.static import static_shapes
from rl_moe.regularizers import make_regularizer
from tests.conftest import CLI_TINY, moe_ppo


def _trained(name: str, grad_clip: str = "joint", **settings: object):
    model = moe_ppo(regularizers=[make_regularizer(name, **settings)], grad_clip=grad_clip, policy_kwargs={"critic_moe": True})
    model.learn(128)
    return model


def _outputs(model) -> list[torch.Tensor]:
    obs = torch.randn(64, 3, generator=torch.Generator().manual_seed(1))
    policy = model.policy
    out = []
    for static in (False, True):
        with torch.no_grad(), static_shapes(static):
            out += [policy.actor_net(obs).out, policy.critic_net(obs).out]
    return out


def _opt_params(model) -> list[torch.nn.Parameter]:
    return [p for g in model.policy.optimizer.param_groups for p in g["params"]]


@pytest.mark.parametrize("target", ["actor", "both"])
def test_injection_leaves_the_output_unchanged_bit_for_bit(target: str) -> None:
    model = _trained("injection", target=target)
    before = _outputs(model)
    n_before = sum(p.numel() for p in model.policy.parameters())
    for task in (1, 2):  # a second injection stacks on the first
        model.start_task(task)
        for a, b in zip(before, _outputs(model)):
            assert torch.equal(a, b)
    stack = model.policy.actor_net.experts
    e, h, d = stack.weights[-1].shape
    per_injection = 2 * (e * h * d + e * d)  # a fresh head and its frozen copy
    critic = model.policy.critic_net.experts
    grown = 2 * per_injection + (0 if target == "actor" else 2 * 2 * (critic.weights[-1].numel() + critic.biases[-1].numel()))
    assert sum(p.numel() for p in model.policy.parameters()) == n_before + grown
    assert len(stack.injected) == 2
    # Only the newest head trains; the optimizer holds every parameter in module order.
    trainable = {id(p) for p in (stack.injected.heads_w[1], stack.injected.heads_b[1])}
    head_params = [stack.weights[-1], stack.biases[-1], *stack.injected.parameters()]
    assert {id(p) for p in head_params if p.requires_grad} == trainable
    assert _opt_params(model) == list(model.policy.parameters())
    assert model.regularizers[0].logs() == {"injection_count": 2.0, "injection_frozen_params": float(grown // 2)}


@pytest.mark.parametrize("grad_clip", ["joint", "separate"])
def test_after_injection_only_the_new_head_and_the_torso_train_under_both_clipping_rules(grad_clip: str) -> None:
    model = _trained("injection", grad_clip)
    model.start_task(1)
    stack = model.policy.actor_net.experts
    frozen = [t.detach().clone() for t in (stack.weights[-1], stack.biases[-1], stack.injected.start_w[0], stack.injected.start_b[0])]
    fresh, torso = stack.injected.heads_w[0].detach().clone(), stack.weights[0].detach().clone()
    split = split_actor_critic(model.policy)
    assert any(p is stack.injected.heads_w[0] for p in split.actor) and not any(p is stack.weights[-1] for p in split.actor)
    model.learn(128, reset_num_timesteps=False)
    assert model._update is not None and model._update.optimizer is model.policy.optimizer
    assert any(p is stack.injected.heads_w[0] for p in model._update.split.actor)
    assert all(torch.equal(a, b) for a, b in zip(frozen, (stack.weights[-1], stack.biases[-1], stack.injected.start_w[0], stack.injected.start_b[0])))
    assert not torch.equal(fresh, stack.injected.heads_w[0]) and not torch.equal(torso, stack.weights[0])
    assert model.policy.optimizer.state[stack.injected.heads_w[0]]["exp_avg"].abs().sum() > 0


def test_a_grown_checkpoint_loads_into_a_fresh_learner(tmp_path: Path) -> None:
    model = _trained("injection")
    model.start_task(1)
    model.learn(128, reset_num_timesteps=False)
    model.save(tmp_path / "grown.zip")
    fresh = moe_ppo(regularizers=[make_regularizer("injection")], policy_kwargs={"critic_moe": True})
    fresh.set_parameters(str(tmp_path / "grown.zip"), exact_match=True, device="cpu")
    pairs = list(zip(model.policy.named_parameters(), fresh.policy.named_parameters()))
    assert len(pairs) == len(list(model.policy.parameters())) == len(list(fresh.policy.parameters()))
    for (na, a), (nb, b) in pairs:
        assert na == nb and torch.equal(a, b) and a.requires_grad == b.requires_grad, na
    sa, sb = model.policy.optimizer.state_dict(), fresh.policy.optimizer.state_dict()
    assert sa["param_groups"] == sb["param_groups"] and sa["state"].keys() == sb["state"].keys()
    for k in sa["state"]:
        assert all(torch.equal(sa["state"][k][m], sb["state"][k][m]) for m in sa["state"][k])


def _optimizer_state(model) -> dict[str, dict[str, torch.Tensor]]:
    names = {id(p): n for n, p in model.policy.named_parameters()}
    return {names[id(p)]: {k: v.clone() for k, v in s.items()} for p, s in model.policy.optimizer.state.items()}


@pytest.mark.parametrize(
    "settings, expected",
    [
        ({}, {"experts.weights.2", "experts.biases.2"}),
        ({"layers": 2, "gate": True}, {"experts.weights.1", "experts.biases.1", "experts.weights.2", "experts.biases.2", "gate.logits.weight", "gate.logits.bias"}),
    ],
    ids=["heads", "two-layers-and-gate"],
)
def test_reset_changes_exactly_its_parameters_and_their_adam_state(settings: dict, expected: set[str]) -> None:
    model = _trained("reset", **settings)
    params = {n: p.detach().clone() for n, p in model.policy.named_parameters()}
    state = _optimizer_state(model)
    model.regularizers[0].apply(model.policy)
    prefix = "mlp_extractor.actor_net."
    reset = {prefix + n for n in expected}
    changed = {n for n, p in model.policy.named_parameters() if not torch.equal(p, params[n])}
    assert changed == reset
    after = _optimizer_state(model)
    for name, entries in after.items():
        for key, value in entries.items():
            if name in reset:
                assert not value.any(), (name, key)  # a fresh Adam state: moments and step 0
            else:
                assert torch.equal(value, state[name][key]), (name, key)
    # Known answer: each expert's fresh head is orthogonal with the head's gain (0.01 for a mean).
    head = model.policy.actor_net.experts.weights[-1]  # (E, H, D)
    gram = head.transpose(1, 2) @ head  # (E, D, D)
    assert torch.allclose(gram, 0.01**2 * torch.eye(head.shape[2]).expand_as(gram), atol=1e-9)
    assert model.regularizers[0].logs() == {"reset_count": 1.0, "reset_params": float(sum(params[n].numel() for n in reset))}


def test_reset_every_n_updates_and_a_resumed_reset_draws_the_same_weights() -> None:
    model = _trained("reset", every_updates=3)  # 128 steps: 2 updates x 2 epochs x 2 minibatches = 8 steps
    assert model.regularizers[0].resets == 8 // 3
    a, b = make_regularizer("reset", seed=4), make_regularizer("reset", seed=4)
    b.load_state_dict(a.state_dict(None), None)
    first, second = (moe_ppo(policy_kwargs={"critic_moe": True}) for _ in range(2))
    a.apply(first.policy)
    b.apply(second.policy)
    assert torch.equal(first.policy.actor_net.experts.weights[-1], second.policy.actor_net.experts.weights[-1])


def _tb_tags(run: Path) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return {t: [e.value for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


@pytest.mark.parametrize("suite", ["smoke", "cw10"])
@pytest.mark.parametrize("method, tag", [("injection", "train/injection_count"), ("reset", "train/reset_count")])
def test_two_task_runs_log_the_method(tmp_path: Path, suite: str, method: str, tag: str) -> None:
    run = tmp_path / "run"
    argv = ["--suite", suite, "--method", method, "--tasks", "2", "--steps-per-task", "256", *CLI_TINY, "--run-dir", str(run)]
    assert main([*argv, "--vec-env", "dummy"]) == 0
    values = _tb_tags(run)[tag]
    assert values[0] == 0.0 and values[-1] == 1.0  # one boundary: one injection or reset


@pytest.mark.parametrize("boundary", [5, 7], ids=["at-task-2-start", "inside-task-2"])
def test_a_run_killed_after_an_injection_resumes_to_the_same_policy(tmp_path: Path, boundary: int) -> None:
    from tests.test_intask import _interrupt_at_boundary, _params

    argv = ["--suite", "smoke", "--method", "injection", "--tasks", "2", "--steps-per-task", "512", *CLI_TINY, "--set", "checkpoint.every_steps=128"]
    full = tmp_path / "full"
    assert main([*argv, "--run-dir", str(full)]) == 0
    cut = tmp_path / "cut"
    with pytest.MonkeyPatch.context() as m:
        m.setattr("tests.test_intask.SMOKE", argv)
        # 4 rollouts a task: the 5th call is task 2's start (after the injection, nothing of task 2
        # saved), the 7th its second boundary (an in-task checkpoint of the grown network)
        assert _interrupt_at_boundary(cut, boundary) == 130
    assert main(["--resume", str(cut), "--no-progress"]) == 0
    pa, pb = _params(full), _params(cut)
    assert pa.keys() == pb.keys() and len(pa) == 2
    for name in pa:
        assert pa[name].keys() == pb[name].keys()
        for key in pa[name]:
            assert torch.equal(pa[name][key], pb[name][key]), (name, key)
    last = sorted(pa)[-1]
    assert any("injected" in k for k in pa[last])
    with zipfile.ZipFile(full / "checkpoints" / last) as fa, zipfile.ZipFile(cut / "checkpoints" / last) as fb:
        oa, ob = (torch.load(io.BytesIO(f.read("policy.optimizer.pth")), weights_only=True) for f in (fa, fb))
    assert oa["state"].keys() == ob["state"].keys()
    assert all(torch.equal(oa["state"][k][m], ob["state"][k][m]) for k in oa["state"] for m in oa["state"][k])


@pytest.mark.parametrize("name", ["reset", "snp"])
def test_every_n_updates_counts_td3_gradient_steps_not_its_actor_steps(name: str) -> None:
    """TD3 with policy_delay 2 makes 40 gradient steps (40 critic steps, 20 delayed actor steps):
    every 10 updates is every 10 critic steps, 4 times, not 6 (critic and actor steps together)."""
    import gymnasium as gym

    from rl_moe.algos import MoETD3
    from rl_moe.policies import MoETD3Policy

    reg = make_regularizer(name, every_updates=10, **({"target": "both"} if name == "reset" else {}))
    model = MoETD3(MoETD3Policy, gym.make("Pendulum-v1"), regularizers=[reg], learning_starts=24, batch_size=16, seed=0, device="cpu",
                   policy_kwargs={"n_experts": 4, "top_k": 2, "hidden": (16, 16)})  # fmt: skip
    model.learn(64)
    assert (model.policy_delay, getattr(reg, "resets", None) if name == "reset" else reg.applied) == (2, 4)
