"""The learner's regularizer hook: terms are summed once, logged, and lifecycle hooks fire."""

import gymnasium as gym
import pytest
import torch
from stable_baselines3.common.logger import KVWriter, Logger

from rl_moe.algos import MoEPPO, MoETD3
from rl_moe.algos.backward import regularized_backward
from rl_moe.algos.common import DeviceTermLog
from rl_moe.policies import MoETD3Policy
from rl_moe.regularizers import LossContext, Penalty, Regularizer
from tests.conftest import NETS, moe_ppo

TINY = {"moe": "topk", **NETS["three"]}


class Capture(KVWriter):
    def __init__(self):
        self.records: list[dict] = []

    def write(self, key_values, key_excluded, step=0):
        self.records.append(dict(key_values))


class PullLogStd(Regularizer):
    """Pulls the PPO log-std to a target; counts hook calls."""

    name = "pull"

    def __init__(self, target: float, coef: float, phases=("ppo",)):
        self.target, self.coef, self.phases = target, coef, phases
        self.calls = {"penalty": 0, "after": 0, "start": 0, "task": []}
        self.seen_outputs = 0

    def on_training_start(self, algo):
        self.calls["start"] += 1

    def on_task_start(self, algo, task_index):
        self.calls["task"].append(task_index)

    def penalty(self, ctx: LossContext):
        if ctx.phase not in self.phases:
            return []
        self.calls["penalty"] += 1
        self.seen_outputs += int(any(o is not None for step in ctx.roles.values() for o in step.outputs))
        params = ctx.algo.policy.log_std if ctx.phase == "ppo" else ctx.algo.actor.net.experts.biases[-1]
        return [Penalty(self.name, (params - self.target).pow(2).sum(), self.coef)]

    def after_update(self, algo, phase):
        self.calls["after"] += 1


def _ppo(regs, seed=0):
    model = moe_ppo(gym.make("Pendulum-v1"), net="three", regularizers=regs, batch_size=16, seed=seed)
    cap = Capture()
    model.set_logger(Logger(folder=None, output_formats=[cap]))
    return model, cap


def test_penalty_changes_the_update_and_is_logged():
    reg = PullLogStd(target=3.0, coef=10.0)
    model, cap = _ppo([reg])
    model.start_task(0)
    model.start_task(1)
    model.learn(128)  # two iterations: SB3 dumps the first update's logs at the second
    base, _ = _ppo([])
    base.learn(128)
    n_minibatches = 2 * (2 * 64 // 16)
    assert reg.calls == {"penalty": n_minibatches, "after": n_minibatches, "start": 1, "task": [0, 1]}
    assert reg.seen_outputs == n_minibatches
    # Adam moves log_std by about lr per step towards the target: 16 steps of 3e-4.
    moved = (model.policy.log_std - base.policy.log_std).mean().item()
    assert moved > 16 * 3e-4 * 0.5
    rec = [r for r in cap.records if "train/loss_pull" in r][-1]
    assert rec["train/coef_pull"] == pytest.approx(10.0)
    assert 0 < rec["train/loss_pull"] <= 9.0 + 1e-3  # (0 - 3)^2 at most, per action dim


def test_zero_coefficient_is_bit_identical():
    reg = PullLogStd(target=3.0, coef=0.0)
    model, _ = _ppo([reg])
    model.learn(64)
    base, _ = _ppo([])
    base.learn(64)
    assert all(torch.equal(a, b) for a, b in zip(model.policy.parameters(), base.policy.parameters()))


def test_td3_phases_get_their_own_context():
    reg = PullLogStd(target=2.0, coef=5.0, phases=("td3_actor",))
    model = MoETD3(MoETD3Policy, gym.make("Pendulum-v1"), regularizers=[reg], learning_starts=32, batch_size=16,
                   seed=0, device="cpu", policy_kwargs=TINY)
    model.learn(64)
    updates = 64 - 32
    assert reg.calls["penalty"] == updates // model.policy_delay
    assert reg.calls["after"] == updates + updates // model.policy_delay


def test_regularizers_are_not_pickled_and_can_be_given_on_load(tmp_path):
    reg = PullLogStd(target=1.0, coef=1.0)
    model, _ = _ppo([reg])
    model.learn(64)
    model.save(tmp_path / "m.zip")
    fresh = PullLogStd(target=1.0, coef=1.0)
    loaded = MoEPPO.load(tmp_path / "m.zip", regularizers=[fresh], device="cpu")
    assert loaded.regularizers == [fresh] and fresh.calls["start"] == 1
    assert MoEPPO.load(tmp_path / "m.zip", device="cpu").regularizers == []


@pytest.mark.parametrize("n_terms", [1, 2])
def test_learner_resolves_gradient_scaled_terms_exactly(n_terms: int):
    """GradScale terms: the update equals grad(reference + rest + sum_k lambda_k * penalty_k), each
    lambda_k the ratio of the reference's and penalty_k's gradient norms over the named parameters
    (the reference gradient is updated in place, so every norm must be taken before that)."""
    from rl_moe.regularizers import GradScale

    torch.manual_seed(0)
    model, _ = _ppo([])
    policy = model.policy
    obs = torch.randn(16, 3)
    out = policy.actor_net(obs)
    value = policy.critic_net(obs).out
    reference = out.out.pow(2).mean() + policy.log_std.sum()
    rest = 0.5 * value.pow(2).mean()
    theta = tuple(policy.actor_net.parameters())
    pens = [out.groups[0].expert.hidden[-1].pow(3).mean(), out.groups[0].expert.hidden[0].abs().mean()][:n_terms]
    rhos = [0.7, -0.2][:n_terms]

    class Scaled(Regularizer):
        def __init__(self, k: int) -> None:
            self.k, self.name = k, f"scaled{k}"

        def penalty(self, ctx):
            return [Penalty(self.name, pens[self.k], 0.0, GradScale(rhos[self.k], reference, theta))]

    model.regularizers = [Scaled(k) for k in range(n_terms)]
    params = list(policy.parameters())
    norm = lambda gs: torch.sqrt(sum(g.pow(2).sum() for g in gs if g is not None))
    g_ref = norm(torch.autograd.grad(reference, theta, retain_graph=True, allow_unused=True))
    lams = [rho * g_ref / (norm(torch.autograd.grad(pen, theta, retain_graph=True, allow_unused=True)) + 1e-8) for rho, pen in zip(rhos, pens)]
    full = reference + rest + sum(lam.detach() * pen for lam, pen in zip(lams, pens))
    expected = torch.autograd.grad(full, params, retain_graph=True, allow_unused=True)
    policy.optimizer.zero_grad()
    sink = DeviceTermLog()
    total = regularized_backward(model.regularizers, LossContext(model, "ppo", None), reference, rest, params, sink)
    for p, g in zip(params, expected):
        if g is None:
            assert p.grad is None or torch.all(p.grad == 0)
        else:
            torch.testing.assert_close(p.grad, g, rtol=1e-5, atol=1e-7)
    assert float(total) == pytest.approx(float(full), rel=1e-5)
    for k, lam in enumerate(lams):
        assert sink.means()[f"train/coef_scaled{k}"] == pytest.approx(float(lam), rel=1e-5)


def test_gradient_scaled_term_without_gradient_logs_coefficient_zero():
    """A penalty whose gradient is 0 (e.g. SPHERE at isotropic features) logs lambda = 0, not
    rho * ||g|| / eps (about 1e6)."""
    from rl_moe.regularizers import GradScale

    model, _ = _ppo([])
    policy = model.policy
    reference = policy.actor_net(torch.randn(8, 3)).out.pow(2).mean()
    theta = tuple(policy.actor_net.parameters())

    class Flat(Regularizer):
        name = "flat"

        def penalty(self, ctx):
            return [Penalty(self.name, 0.0 * theta[0].sum(), 0.0, GradScale(0.1, reference, theta))]

    model.regularizers = [Flat()]
    policy.optimizer.zero_grad()
    sink = DeviceTermLog()
    regularized_backward(model.regularizers, LossContext(model, "ppo", None), reference, reference.new_zeros(()), list(policy.parameters()), sink)
    assert sink.means()["train/coef_flat"] == 0.0


@pytest.mark.parametrize("guard", ["ceiling", "pcgrad"])
def test_guarded_scaled_term_ceiling_and_pcgrad(guard: str) -> None:
    """A ceiling caps lambda; PCGrad removes the penalty's component that opposes the reference
    gradient (the SPHERE authors' sphere_use_pcgrad), leaving one that agrees untouched."""
    from rl_moe.regularizers import GradScale, scaled_coef

    model, _ = _ppo([])
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    a, b = torch.tensor([3.0, 0.0]), torch.tensor([-1.0, 2.0])  # a . b = -3 < 0: opposing
    reference = (w * a).sum()
    penalty = (w * b).sum()
    rho = 0.5
    lam = rho * a.norm() / b.norm()

    class Guarded(Regularizer):
        name = "guarded"

        def penalty(self, ctx):
            extra = {"ceiling": 0.1} if guard == "ceiling" else {"pcgrad": True}
            return [Penalty(self.name, penalty, 0.0, GradScale(rho, reference, (w,), **extra))]

    model.regularizers = [Guarded()]
    sink = DeviceTermLog()
    regularized_backward(model.regularizers, LossContext(model, "ppo", None), reference, reference.new_zeros(()), [w], sink)
    if guard == "ceiling":
        assert float(lam) > 0.1
        torch.testing.assert_close(w.grad, a + 0.1 * b)
        assert sink.means()["train/coef_guarded"] == pytest.approx(0.1)
        # the coefficient reported on its own obeys the same ceiling (one rule: clamp_coef)
        assert scaled_coef(Penalty("guarded", penalty, 0.0, GradScale(rho, reference, (w,), ceiling=0.1))) == pytest.approx(0.1)
    else:
        reg = lam * b
        expected = a + reg - (reg @ a) / (a @ a) * a  # the opposing part along a is removed
        torch.testing.assert_close(w.grad, expected, rtol=1e-5, atol=1e-6)
        assert float(w.grad @ a) >= float(a @ a) - 1e-4  # the step no longer fights the reference


def test_loss_context_pads_outputs_keeps_the_batch_and_knows_no_unknown_phase() -> None:
    from rl_moe.regularizers.hooks import LossContext, loss_context

    model, _ = _ppo([])
    zero = torch.zeros(())
    ctx = loss_context(model, "ppo", "the batch", {"actor": ()}, {"actor": zero, "critic": zero}, {})
    assert ctx.batch == "the batch" and ctx.sync_free is False and ctx.phase == "ppo"
    for step in ctx.roles.values():
        assert step.outputs == (None,) * len(step.role.networks)
    assert [s.role.name for s in ctx.active(("critic", "actor"))] == ["actor", "critic"]  # role order, not the targets'
    assert LossContext(model, "no such phase", None, ctx.roles, {}).active(("actor",)) == []


def test_loss_context_pads_a_partial_tuple_and_passes_sync_free() -> None:
    """TD3's critic role has two Q networks: one output given, the second padded with None."""
    from rl_moe.regularizers.hooks import loss_context

    model = MoETD3(MoETD3Policy, gym.make("Pendulum-v1"), regularizers=[], learning_starts=16, batch_size=16, seed=0, device="cpu", policy_kwargs=TINY)
    zero = torch.zeros(())
    ctx = loss_context(model, "td3_critic", None, {"critic": ("q1",)}, {"critic": zero}, {}, sync_free=True)
    assert ctx.roles["critic"].outputs == ("q1", None) and ctx.sync_free is True
