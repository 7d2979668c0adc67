"""Shrink-and-perturb (Ash & Adams 2020) and L2 Init (Kumar et al. 2023): known answers, and a
smoke CRL run of each through the CLI and into the report."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch
from stable_baselines3.common.env_util import make_vec_env

from rl_moe.algos import MoEPPO
from rl_moe.policies import MoEActorCriticPolicy, policy_roles
from rl_moe.regularizers import L2Init, ShrinkPerturb, make_regularizer
from tests.conftest import NETS

SMALL = {"moe": "topk", **NETS["small"]}


def _policy() -> MoEActorCriticPolicy:
    env = make_vec_env("Pendulum-v1", n_envs=1, seed=0)
    return MoEPPO(MoEActorCriticPolicy, env, n_steps=64, batch_size=32, seed=0, device="cpu", policy_kwargs=SMALL).policy


class _Ctx:
    """The part of a LossContext a role-wide penalty reads: the active roles' steps."""

    def __init__(self, policy) -> None:
        self.roles = policy_roles(policy)

    def active(self, targets):
        return [types.SimpleNamespace(role=self.roles[r]) for r in targets]


def test_l2init_is_zero_at_init_and_its_gradient_is_two_lambda_times_the_drift() -> None:
    policy = _policy()
    reg = make_regularizer("l2init", coef=0.3)
    reg.on_training_start(types.SimpleNamespace(policy=policy))
    (term,) = reg.penalty(_Ctx(policy))
    assert term.name == "l2init" and term.coef == 0.3 and float(term.loss.detach()) == 0.0
    params = policy_roles(policy)["actor"].parameters
    start = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p in params:
            p.add_(torch.randn_like(p) * 0.01)
    (term,) = reg.penalty(_Ctx(policy))
    grads = torch.autograd.grad(term.coef * term.loss, params)
    for g, p, p0 in zip(grads, params, start):
        torch.testing.assert_close(g, 2 * 0.3 * (p.detach() - p0))
    # The critic is not the default target: its parameters carry no term.
    assert {id(p) for p in policy_roles(policy)["critic"].parameters}.isdisjoint(reg._init)


def test_l2init_settings_names_and_a_saved_theta0_of_another_dtype() -> None:
    from rl_moe.regularizers.l2init import L2InitConfig

    assert L2InitConfig(coef=0.0).coef == 0.0  # lambda = 0 is allowed (the method switched off)
    with pytest.raises(ValueError, match="l2init coef must be >= 0, got -0.1"):
        L2InitConfig(coef=-0.1)
    reg = L2Init(L2InitConfig(coef=0.25, target="both"))
    assert reg.config == L2InitConfig(coef=0.25, target="both")  # the config given, not the defaults
    policy = _policy()
    reg.on_training_start(types.SimpleNamespace(policy=policy))
    ctx = _Ctx(policy)
    assert [t.name for t in reg.penalty(ctx)] == ["l2init_actor", "l2init_critic"]  # one term per role, named by it
    # theta_0 saved in float64 (or on another device) comes back as each parameter's own tensor
    state = reg.state_dict(policy)
    reg.load_state_dict({"init": {k: t.double() for k, t in state["init"].items()}}, policy)
    params = dict(policy.named_parameters())
    assert all(reg._init[id(params[k])].dtype == params[k].dtype == torch.float32 for k in state["init"])
    assert all(float(t.loss) == 0.0 for t in reg.penalty(ctx))


def test_snp_shrinks_by_lambda_and_perturbs_at_the_initial_scale() -> None:
    policy = _policy()
    algo = types.SimpleNamespace(policy=policy)
    params = policy_roles(policy)["actor"].parameters
    shrink_only = ShrinkPerturb(shrink=0.4, noise=0.0)
    shrink_only.on_training_start(algo)
    before = [p.detach().clone() for p in params]
    shrink_only.on_task_start(algo, 0)  # the first task starts as built
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    shrink_only.on_task_start(algo, 1)
    for p, b in zip(params, before):
        torch.testing.assert_close(p.detach(), 0.4 * b)
    noise_only = ShrinkPerturb(shrink=1.0, noise=0.1)
    noise_only.on_training_start(algo)
    big = max(params, key=lambda p: p.numel())
    std0 = float(big.detach().std())
    ref = big.detach().clone()
    noise_only.apply(algo)
    ratio = float((big.detach() - ref).std()) / std0
    assert ratio == pytest.approx(0.1, rel=0.05)  # sigma times the tensor's initial std
    assert noise_only.applied == 1


def test_snp_per_update_variant_applies_every_n_updates() -> None:
    policy = _policy()
    algo = types.SimpleNamespace(policy=policy)
    reg = ShrinkPerturb(shrink=0.5, noise=0.0, every_updates=3)
    reg.on_training_start(algo)
    reg.on_task_start(algo, 1)  # the per-update variant leaves task boundaries alone
    for _ in range(7):
        reg.after_update(algo, "ppo")
    assert reg.applied == 2


def test_snp_settings_are_checked_and_the_config_given_is_kept() -> None:
    from rl_moe.regularizers.snp import SNPConfig

    assert SNPConfig(shrink=0.0).shrink == 0.0 and SNPConfig(shrink=1.0).shrink == 1.0  # both ends are allowed
    with pytest.raises(ValueError, match=r"snp shrink must lie in \[0, 1\], got 1.5"):
        SNPConfig(shrink=1.5)
    with pytest.raises(ValueError, match="snp noise and every_updates must be >= 0, got -0.1 and 0"):
        SNPConfig(noise=-0.1)
    with pytest.raises(ValueError, match="got 0.1 and -1"):
        SNPConfig(every_updates=-1)
    assert ShrinkPerturb(SNPConfig(shrink=0.3, noise=0.2)).config == SNPConfig(shrink=0.3, noise=0.2)


def test_snp_counts_gradient_steps_from_zero_and_every_update_applies_at_n_1() -> None:
    policy = _policy()
    algo = types.SimpleNamespace(policy=policy)
    reg = ShrinkPerturb(shrink=0.5, noise=0.0, every_updates=3)
    reg.on_training_start(algo)
    reg.after_update(algo, "ppo")
    reg.after_update(algo, "ppo")
    assert reg.applied == 0  # two steps of three
    reg.after_update(algo, "ppo")
    assert reg.applied == 1 and reg.state_dict(policy)["updates"] == 3
    every = ShrinkPerturb(shrink=0.5, noise=0.0, every_updates=1)
    every.on_training_start(algo)
    for _ in range(2):
        every.after_update(algo, "ppo")
    assert every.applied == 2


def test_snp_noise_scale_of_one_and_two_element_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-element tensor has no spread at initialization and gets no noise (its sample std
    would be NaN); a two-element one gets its sample std."""
    from rl_moe.regularizers import snp

    one = torch.nn.Parameter(torch.tensor([0.7]))
    two = torch.nn.Parameter(torch.tensor([1.0, 3.0]))
    monkeypatch.setattr(snp, "policy_roles", lambda policy: {"actor": types.SimpleNamespace(parameters=[one, two])})
    algo = types.SimpleNamespace(policy=None)
    reg = ShrinkPerturb(shrink=1.0, noise=0.1)
    reg.on_training_start(algo)
    assert reg._std == {id(one): 0.0, id(two): pytest.approx(2**0.5)}
    reg.apply(algo)
    assert float(one.detach()) == pytest.approx(0.7) and bool(torch.isfinite(two).all()) and not torch.equal(two.detach(), torch.tensor([1.0, 3.0]))


def test_snp_state_names_every_targeted_parameter_and_loads_back() -> None:
    policy = _policy()
    reg = ShrinkPerturb()
    reg.on_training_start(types.SimpleNamespace(policy=policy))
    state = reg.state_dict(policy)
    names = {n for n, p in policy.named_parameters() if any(p is q for q in policy_roles(policy)["actor"].parameters)}
    assert set(state["std"]) == names and names
    back = ShrinkPerturb()
    back.load_state_dict(state, policy)
    assert back._std == reg._std


@pytest.mark.parametrize("method", ["snp", "l2init"])
def test_smoke_crl_run_and_report(tmp_path: Path, method: str) -> None:
    from rl_moe.crl import main
    from rl_moe.report.__main__ import main as report

    out = tmp_path / "runs"
    assert main(["--suite", "smoke", "--method", method, "--tasks", "2", "--steps-per-task", "256", "--preset", "tiny", "--no-progress", "--out", str(out)]) == 0
    (run,) = [p for p in out.glob("*/*") if p.is_dir()]
    res = json.loads((run / "results.json").read_text())
    assert res["complete"] and res["method"] == method
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    if method == "snp":
        assert acc.Scalars("train/snp_applied")[-1].value == 1.0  # once, at the second task's start
    else:
        values = [e.value for e in acc.Scalars("train/loss_l2init")]
        assert values[0] >= 0 and max(values) > 0 and "train/coef_l2init" in tags
    assert report([str(out), "--out", str(tmp_path / "report")]) == 0
    assert method in (tmp_path / "report" / "report.md").read_text()


def test_l2init_keeps_its_theta0_across_a_resume(tmp_path: Path) -> None:
    """theta_0 is state: a learner built with another seed continues toward the saved one."""
    from rl_moe.continual.state_files import load_regularizer_state, save_regularizer_state

    def learner(seed: int) -> MoEPPO:
        env = make_vec_env("Pendulum-v1", n_envs=1, seed=seed)
        return MoEPPO(MoEActorCriticPolicy, env, regularizers=[L2Init(coef=0.1)], n_steps=64, batch_size=32, n_epochs=2, seed=seed, device="cpu", policy_kwargs=SMALL)

    a = learner(0)
    a.learn(128)
    save_regularizer_state(tmp_path / "reg.pt", a.regularizer_state())
    b = learner(1)
    before = b.regularizer_state()["0:l2init"]["init"]
    saved = a.regularizer_state()["0:l2init"]["init"]
    assert any(not torch.equal(before[k], saved[k]) for k in saved)
    b.load_regularizer_state(load_regularizer_state(tmp_path / "reg.pt"))
    after = b.regularizer_state()["0:l2init"]["init"]
    assert after.keys() == saved.keys() and all(torch.equal(after[k], saved[k]) for k in saved)
