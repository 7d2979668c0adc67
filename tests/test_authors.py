"""``--preset authors``: the SPHERE authors' network, their lambda arithmetic and SBX's KL-adaptive
learning rate, each against a known answer (sphere-rl/sphere ``policies.py`` and ``moe_ppo.py``)."""

from __future__ import annotations

import math
import types

import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch import nn

from rl_moe.algos.backward import regularized_backward
from rl_moe.algos.common import DeviceTermLog
from rl_moe.algos.kl_lr import KLAdaptiveLR
from rl_moe.continual.agents import net_configs_for
from rl_moe.continual.config import preset_overrides
from rl_moe.continual.resolve import RunRequest, resolve
from rl_moe.errors import UsageError
from rl_moe.nn.experts import StackedExperts
from rl_moe.policies import MoEActorCriticPolicy
from rl_moe.regularizers import Sphere, loss_context, scaled_coef
from rl_moe.regularizers.hooks import GradScale, Penalty, adaptive_coef
from tests.conftest import moe_ppo


def _cfg(method: str, *overrides: str):
    return resolve(RunRequest(suite="cw10", method=method, tasks=1, device="cpu", vec_env="dummy", preset="authors", overrides=overrides))


# --- the preset ----------------------------------------------------------------------------------


def test_preset_sets_network_for_every_method_and_lambda_only_where_sphere_runs() -> None:
    for method in ("topk", "sphere"):
        nets = net_configs_for(_cfg(method), 39, 4)
        assert nets.actor.init == nets.critic.init == "lecun"
        assert nets.actor.gate_hidden == (256, 256, 256)
    sphere = _cfg("sphere").regularizers["sphere"]
    assert (sphere.norm_eps, sphere.log_std_in_theta, sphere.eps) == (1e-8, True, 1e-8)
    assert "sphere" not in _cfg("topk").regularizers
    # --set comes after the preset and wins.
    cfg = _cfg("sphere", "net.gate_hidden=64", "reg.sphere.norm_eps=0")
    assert net_configs_for(cfg, 39, 4).actor.gate_hidden == (64,)
    assert cfg.regularizers["sphere"].norm_eps == 0.0
    assert preset_overrides("authors", ()) == ("net.init=lecun", "net.gate_hidden=256,256,256")
    with pytest.raises(UsageError, match="'author'.*authors"):
        preset_overrides("author", ())


def test_preset_network_has_lecun_std_on_every_layer_a_three_layer_gate_and_log_std_zero() -> None:
    torch.manual_seed(0)
    nets = net_configs_for(_cfg("sphere"), 39, 4)
    box = lambda d: spaces.Box(-1, 1, (d,), np.float32)  # noqa: E731
    policy = MoEActorCriticPolicy(box(39), box(4), lambda _: 3e-4, actor_cfg=nets.actor, critic_cfg=nets.critic)
    assert torch.equal(policy.log_std.detach(), torch.zeros(4))  # their log_std_init = 0.0
    layers: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (fan_in, weight, bias)
    for net in (policy.actor_net, policy.critic_net):
        for module in net.modules():
            if type(module) is StackedExperts:
                layers += [(w.shape[1], w[e], b[e]) for w, b in zip(module.weights, module.biases) for e in range(w.shape[0])]
            elif isinstance(module, nn.Linear):
                layers.append((module.in_features, module.weight, module.bias))
    # Experts: 10 x (3 hidden + head); gate: 3 hidden + logits; critic: 3 hidden + value head.
    assert len(layers) == 10 * 4 + 4 + 4
    for fan_in, w, b in layers:
        w = w.detach()
        std = math.sqrt(1.0 / fan_in)  # Flax lecun_normal: variance 1/fan_in after truncation
        assert float(w.std()) == pytest.approx(std, rel=0.25 if w.numel() < 200 else 0.08)
        assert float(w.abs().max()) <= 2 * std / 0.87962566103423978 + 1e-7  # truncated at 2 sigma
        assert float(b.detach().abs().max()) == 0.0
    gate = [m for m in policy.actor_net.gate.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in gate] == [(39, 256), (256, 256), (256, 256), (256, 10)]


# --- lambda ----------------------------------------------------------------------------------------


def test_authors_lambda_by_hand_on_fixed_gradients() -> None:
    """Linear losses have known gradients: g_ref = (3, 4) (norm 5), g_pen = (6e-5, 8e-5) (norm 1e-4)."""
    p = nn.Parameter(torch.zeros(2))
    ref = (torch.tensor([3.0, 4.0]) * p).sum()
    pen = (torch.tensor([6e-5, 8e-5]) * p).sum()
    ours = scaled_coef(Penalty("s", pen, 0.0, GradScale(0.1, ref, (p,), 1e-8)))
    theirs = scaled_coef(Penalty("s", pen, 0.0, GradScale(0.1, ref, (p,), 1e-8, norm_eps=1e-8)))
    assert ours == pytest.approx(0.1 * 5.0 / (1e-4 + 1e-8), rel=1e-6)  # 4999.5
    assert theirs == pytest.approx(0.1 * math.sqrt(25 + 1e-8) / (math.sqrt(1e-8 + 1e-8) + 1e-8), rel=1e-6)  # 3535.3
    # A vanishing penalty gradient: ours grows without bound, theirs stops at the floor.
    assert float(adaptive_coef(0.1, torch.tensor(5.0), torch.tensor(1e-9), 1e-8)) == pytest.approx(0.5 / 1.1e-8, rel=1e-6)
    assert float(adaptive_coef(0.1, torch.tensor(5.0), torch.tensor(1e-9), 1e-8, 1e-8)) == pytest.approx(0.5 / (1e-4 + 1e-8), rel=1e-4)
    # The learner applies the same coefficient: grad = g_ref + lambda * g_pen.
    ref2 = (torch.tensor([3.0, 4.0]) * p).sum()
    pen2 = (torch.tensor([6e-5, 8e-5]) * p).sum()
    term = Penalty("s", pen2, 0.0, GradScale(0.1, ref2, (p,), 1e-8, norm_eps=1e-8))
    reg = types.SimpleNamespace(observe=lambda ctx: None, penalty=lambda ctx: [term])
    regularized_backward([reg], None, ref2, ref2.new_zeros(()), [p], DeviceTermLog())  # type: ignore[arg-type, list-item]
    expected = torch.tensor([3.0, 4.0], dtype=torch.float64) + theirs * torch.tensor([6e-5, 8e-5], dtype=torch.float64)
    torch.testing.assert_close(p.grad.double(), expected, rtol=1e-5, atol=0.0)


def test_log_std_in_theta_adds_the_log_std_gradient_to_the_reference_norm() -> None:
    torch.manual_seed(5)
    obs, act = spaces.Box(-1, 1, (5,), np.float32), spaces.Box(-1, 1, (2,), np.float32)
    policy = MoEActorCriticPolicy(obs, act, lambda _: 1e-3, n_experts=4, top_k=2, hidden=(16, 16))
    with torch.no_grad():
        policy.log_std.fill_(0.3)
    out = policy.actor_net(torch.randn(32, 5))
    actor_loss = (out.out**2).mean() + 0.7 * policy.log_std.sum() ** 2  # d/d log_std = 1.4 * 0.6 = 0.84 each
    ctx = loss_context(types.SimpleNamespace(policy=policy), "ppo", None, {"actor": (out,)}, {"actor": actor_loss, "critic": out.out.new_zeros(())}, {"actor": actor_loss})
    (net_only,) = Sphere(rho=0.1, rank_every=0, log_std_in_theta=False).penalty(ctx)
    (with_std,) = Sphere(rho=0.1, rank_every=0, log_std_in_theta=True).penalty(ctx)
    assert [p is policy.log_std for p in net_only.scale.params].count(True) == 0
    assert [p is policy.log_std for p in with_std.scale.params].count(True) == 1
    params = list(policy.actor_net.parameters())
    norm = lambda gs: math.sqrt(sum(float((g**2).sum()) for g in gs if g is not None))  # noqa: E731
    g_ref = norm(torch.autograd.grad(actor_loss, params, retain_graph=True, allow_unused=True))
    g_pen = norm(torch.autograd.grad(net_only.loss, params, retain_graph=True, allow_unused=True))
    assert scaled_coef(net_only) == pytest.approx(0.1 * g_ref / (g_pen + 1e-8), rel=1e-4)
    assert scaled_coef(with_std) == pytest.approx(0.1 * math.sqrt(g_ref**2 + 2 * 0.84**2) / (g_pen + 1e-8), rel=1e-4)


# --- SBX's KL-adaptive learning rate -----------------------------------------------------------------


def test_kl_adaptive_rate_trace_on_a_fixed_kl_sequence() -> None:
    rule = KLAdaptiveLR(0.03)  # no change inside [0.015, 0.06]
    kls = [0.1, 0.1, 0.03, 0.001, 0.015, 0.06, 0.0601, 0.0149] + [0.0] * 20 + [1.0] * 40
    lr, trace = 3e-4, []
    for kl in kls:
        lr = rule.next_lr(lr, kl)
        trace.append(lr)
    assert trace[:8] == pytest.approx([2e-4, 2e-4 / 1.5, 2e-4 / 1.5, 2e-4, 2e-4, 2e-4, 2e-4 / 1.5, 2e-4])
    assert trace[27] == 1e-2 and trace[26] == pytest.approx(min(2e-4 * 1.5**19, 1e-2))  # capped at max_lr
    assert trace[-1] == 1e-5  # floored at min_lr
    with pytest.raises(ValueError, match="target_kl"):
        KLAdaptiveLR(0.0)


class _Recording(KLAdaptiveLR):
    def next_lr(self, lr: float, kl: float) -> float:
        self.seen.append((lr, kl))  # type: ignore[attr-defined]
        return super().next_lr(lr, kl)


def test_learner_applies_the_rule_after_every_minibatch_and_skips_the_schedule() -> None:
    rule = _Recording(0.03)
    object.__setattr__(rule, "seen", [])
    model = moe_ppo(net="tiny", kl_lr=rule, learning_rate=3e-4)
    assert model.fast_path_reason() is not None  # SB3's minibatches: a host read per minibatch
    model.learn(2 * 128)  # two updates of 128 / 32 = 4 minibatches x 2 epochs
    seen = rule.seen  # type: ignore[attr-defined]
    assert len(seen) == 16 and seen[0][0] == pytest.approx(3e-4)
    lr = 3e-4
    for got, kl in seen:  # each minibatch starts from the rate the rule left
        assert got == pytest.approx(lr, rel=1e-12)
        lr = KLAdaptiveLR(0.03).next_lr(lr, kl)
    assert model.policy.optimizer.param_groups[0]["lr"] == pytest.approx(lr, rel=1e-12)
    assert lr != pytest.approx(3e-4)  # the tiny run's KLs leave the band


def test_ppo_target_kl_setting_builds_the_rule_and_rejects_bad_values() -> None:
    cfg = resolve(RunRequest(suite="smoke", method="topk", tasks=1, device="cpu", vec_env="dummy", preset="tiny", overrides=("ppo.target_kl=0.03",)))
    assert cfg.learner_settings.target_kl == 0.03
    with pytest.raises(UsageError, match="target_kl"):
        resolve(RunRequest(suite="smoke", method="topk", tasks=1, device="cpu", vec_env="dummy", preset="tiny", overrides=("ppo.target_kl=-1",)))


def test_kl_adaptive_rate_resumes_inside_a_task_bit_for_bit(tmp_path) -> None:
    """The rate lives in the optimizer's state, which the in-task checkpoint keeps: a run stopped at
    a rollout boundary and resumed equals the uninterrupted one."""
    from rl_moe.continual import intask
    from rl_moe.crl import main
    from tests.test_intask import SMOKE, _same, _scalars

    argv = [*SMOKE, "--set", "ppo.target_kl=0.03"]
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main([*argv, "--run-dir", str(full)]) == 0
    original, calls = intask.InTaskCheckpoint._on_rollout_start, {"n": 0}

    def stop(self):  # type: ignore[no-untyped-def]
        original(self)
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as m:
        m.setattr(intask.InTaskCheckpoint, "_on_rollout_start", stop)
        assert main([*argv, "--run-dir", str(cut)]) != 0
    assert main(["--resume", str(cut), "--no-progress"]) == 0
    _same(full, cut)
    rates = [v for _, v in _scalars(full)["train/learning_rate"]]
    assert len(set(rates)) >= 2 and all(1e-5 <= r <= 1e-2 for r in rates)  # it moved, within bounds


def test_the_kl_adaptive_rule_accepts_its_bounds_and_refuses_just_past_them() -> None:
    """Each bound at its edge is valid (margin 1, factor 1, min_lr = max_lr); a step past any one
    is a ValueError naming the rule and the values."""
    KLAdaptiveLR(0.03, margin=1.0, factor=1.0, min_lr=1e-4, max_lr=1e-4)
    for bad in (dict(margin=0.999), dict(factor=0.999), dict(min_lr=0.0), dict(min_lr=2e-2), dict(max_lr=5e-6)):
        with pytest.raises(ValueError, match=r"need margin >= 1, factor >= 1 and 0 < min_lr <= max_lr, got KLAdaptiveLR\(target_kl=0.03"):
            KLAdaptiveLR(0.03, **bad)
    with pytest.raises(ValueError, match="target_kl must be > 0, got 0.0"):
        KLAdaptiveLR(0.0)


def test_lambda_by_hand_where_the_floor_decides_it_and_the_ceiling_both_ways() -> None:
    """A reference gradient as small as the floor: sqrt(1e-8 + 1e-8) / (sqrt(0 + 1e-8) + 1e-8)
    (the authors' arithmetic), where a sign slip inside either square root changes the answer.
    The lambda ceiling bounds both signs, for tensors and floats alike."""
    from rl_moe.regularizers.hooks import clamp_coef

    ref, pen = torch.tensor(1e-4, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64)
    got = float(adaptive_coef(0.5, ref, pen, 1e-8, norm_eps=1e-8))
    assert got == pytest.approx(0.5 * math.sqrt(2e-8) / (math.sqrt(1e-8) + 1e-8), rel=1e-12)
    big = torch.tensor(3e-3, dtype=torch.float64)
    assert float(adaptive_coef(0.1, big, ref, 1e-8, norm_eps=1e-8)) == pytest.approx(0.1 * math.sqrt(9e-6 + 1e-8) / (math.sqrt(1e-8 + 1e-8) + 1e-8), rel=1e-12)
    assert float(adaptive_coef(0.1, big, pen, 1e-8, norm_eps=0.0)) == 0.0  # no penalty gradient, plain norms: 0
    for coef in (5.0, -5.0, 0.5, -0.5):
        want = max(-2.0, min(2.0, coef))
        assert clamp_coef(coef, 2.0) == want and float(clamp_coef(torch.tensor(coef), 2.0)) == want
        assert clamp_coef(coef, None) == coef
