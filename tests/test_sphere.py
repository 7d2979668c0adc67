"""SPHERE: Gram identities, gradients, known answers, coefficient modes and variants."""

from __future__ import annotations

import itertools
import types

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from rl_moe.maths import effective_rank
from rl_moe.nn import NETWORK_KINDS, Dispatch, build_network
from rl_moe.policies import MoEActorCriticPolicy
from rl_moe.regularizers import LossContext, Sphere, loss_context, SphereConfig, make_regularizer, scaled_coef, sphere_config
from rl_moe.regularizers import gram_kernels as gram_module
from rl_moe.regularizers.gram import FeatureBlock, dense_phi, gram_stats, per_expert_stats
from rl_moe.regularizers.sphere import feature_blocks, sphere_value

torch.set_default_dtype(torch.float32)


def brute(phi: torch.Tensor, alpha: float | None = None) -> torch.Tensor:
    """The paper's definition on a dense Phi: ||A||^2 - tr(A)^2/m, A = Phi^T Phi / N."""
    a = phi.t() @ phi / phi.shape[0]
    if alpha is not None:
        return (a - alpha * torch.eye(a.shape[0], dtype=a.dtype)).pow(2).sum()
    return a.pow(2).sum() - a.trace() ** 2 / a.shape[0]


def _net(kind: str, in_dim: int = 6, out_dim: int = 3, hidden=(12, 10), n_experts: int = 5, top_k: int = 2, **kw):
    return build_network(in_dim, out_dim, kind=kind, n_experts=n_experts, top_k=top_k, hidden=hidden, gate_hidden=(8,), **kw)


@pytest.mark.parametrize("kind", NETWORK_KINDS)
@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("loop_max", [0, 48], ids=["buckets", "per-expert"])
def test_sample_and_feature_space_agree_with_dense_phi(
    kind: str, weighted: bool, loop_max: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both sample-space paths (padded buckets, one matmul per expert) against the definition.
    monkeypatch.setattr(gram_module, "_LOOP_MAX_EXPERTS", loop_max)
    torch.manual_seed(0)
    net = _net(kind).double()
    out = net(torch.randn(24, 6, dtype=torch.float64))
    blocks = feature_blocks(out, (-1,), weighted)
    expected = brute(out.phi(weighted=weighted))
    params = [p for p in net.parameters() if p.requires_grad]
    g_ref = torch.autograd.grad(expected, params, retain_graph=True, allow_unused=True)
    for space in ("sample", "feature"):
        stats = gram_stats(blocks, space)
        value = sphere_value(stats)
        assert stats.dim == out.phi().shape[1]
        torch.testing.assert_close(value, expected, rtol=1e-10, atol=1e-12)
        grads = torch.autograd.grad(value, params, retain_graph=True, allow_unused=True)
        for g, r in zip(grads, g_ref):
            assert (g is None) == (r is None)
            if g is not None:
                torch.testing.assert_close(g, r, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize(("bucket_cost", "loop_max"), [(0.0, 0), (2.0e6, 0), (0.0, 48)])
def test_sample_gram_handles_unbalanced_loads(bucket_cost: float, loop_max: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # One expert takes almost every row, one none: padded buckets (one, or one per load) and the
    # per-expert path must stay exact, value and gradients.
    monkeypatch.setattr(gram_module, "_BUCKET_COST", bucket_cost)
    monkeypatch.setattr(gram_module, "_LOOP_MAX_EXPERTS", loop_max)
    assert len(gram_module._buckets((50, 1, 0, 7, 6), 5)) == (4 if bucket_cost == 0 else 1)
    torch.manual_seed(1)
    n, h = 64, 5
    counts = (50, 1, 0, 7, 6)
    expert_idx = torch.repeat_interleave(torch.arange(5), torch.tensor(counts))
    sample_idx = torch.cat([torch.randperm(n)[:c] for c in counts])
    d = Dispatch(sample_idx, expert_idx, torch.rand(len(sample_idx), dtype=torch.float64), counts, n)
    feats = torch.randn(len(sample_idx), h, dtype=torch.float64, requires_grad=True)
    weight = d.weight.clone().requires_grad_()
    block = FeatureBlock(d, feats, weight)
    phi = dense_phi([block])
    stats = gram_stats([block], "sample")
    torch.testing.assert_close(stats.gram, phi @ phi.t() / n)
    value, expected = sphere_value(stats), brute(phi)
    torch.testing.assert_close(value, expected)
    grads = torch.autograd.grad(value, (feats, weight), retain_graph=True)
    for g, r in zip(grads, torch.autograd.grad(expected, (feats, weight))):
        torch.testing.assert_close(g, r)


def test_gradient_wrt_phi_matches_closed_form() -> None:
    # dL/dPhi = (4/N)(G - tr(G)/m I) Phi with G = Phi Phi^T / N (SPHERE App. A.2).
    torch.manual_seed(2)
    n, m = 10, 30
    phi = torch.randn(n, m, dtype=torch.float64, requires_grad=True)
    d = Dispatch(torch.arange(n), torch.zeros(n, dtype=torch.long), torch.ones(n, dtype=torch.float64), (n,), n)
    loss = sphere_value(gram_stats([FeatureBlock(d, phi)], "sample"))
    (grad,) = torch.autograd.grad(loss, phi)
    g = phi.detach() @ phi.detach().t() / n
    expected = 4 / n * (g - g.trace() / m * torch.eye(n, dtype=torch.float64)) @ phi.detach()
    torch.testing.assert_close(grad, expected)


def _top1_dispatch(n: int, n_experts: int) -> Dispatch:
    expert_idx = torch.arange(n) // (n // n_experts)
    return Dispatch(torch.arange(n), expert_idx, torch.ones(n), (n // n_experts,) * n_experts, n)


def test_isotropic_features_give_zero_and_rank_one_the_known_value() -> None:
    # Phi = I_4 (two experts, two rows each, orthonormal features): A = I/4, penalty 0.
    d = _top1_dispatch(4, 2)
    iso = FeatureBlock(d, torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]), d.weight)
    for space in ("sample", "feature"):
        assert abs(float(sphere_value(gram_stats([iso], space)))) < 1e-7
    assert effective_rank(gram_stats([iso]).gram) == pytest.approx(4.0)
    # Every row the same vector v in one block: A = v v^T, L = ||v||^4 (1 - 1/m) > 0.
    n = 6
    v = torch.tensor([1.0, 2.0, 2.0])
    d1 = Dispatch(torch.arange(n), torch.zeros(n, dtype=torch.long), torch.ones(n), (n,), n)
    rank1 = FeatureBlock(d1, v.repeat(n, 1))
    assert float(sphere_value(gram_stats([rank1]))) == pytest.approx(81.0 * (1 - 1 / 3))
    assert effective_rank(gram_stats([rank1]).gram) == pytest.approx(1.0)


def test_per_expert_and_alpha_variants_match_brute_force() -> None:
    torch.manual_seed(3)
    net = _net("topk").double()
    out = net(torch.randn(30, 6, dtype=torch.float64))
    blocks = feature_blocks(out, (-1,), True)
    phi = out.phi()
    h = out.groups[0].expert.hidden[-1].shape[1]
    per = sum(sphere_value(s).sum() for s in per_expert_stats(blocks))
    expected = sum(brute(phi[:, e * h : (e + 1) * h]) for e in range(5))
    torch.testing.assert_close(per, expected)
    torch.testing.assert_close(Sphere(per_expert=True, rank_every=0).network_loss(out), expected)
    # DS-MoE: a shared and a routed stack of different widths, each block with its own m = H.
    ds = _net("ds").double()
    out_ds = ds(torch.randn(30, 6, dtype=torch.float64))
    cols = [g.expert.hidden[-1].shape[1] for g in out_ds.groups for _ in g.dispatch.counts]
    edges = [0, *torch.tensor(cols).cumsum(0).tolist()]
    phi_ds = out_ds.phi()
    expected_ds = sum(brute(phi_ds[:, a:b]) for a, b in itertools.pairwise(edges))
    torch.testing.assert_close(Sphere(per_expert=True, rank_every=0).network_loss(out_ds), expected_ds)
    torch.testing.assert_close(sphere_value(gram_stats(blocks), alpha=2.0), brute(phi, alpha=2.0))


def test_layer_variants_all_and_joint() -> None:
    torch.manual_seed(4)
    net = _net("ds").double()
    out = net(torch.randn(20, 6, dtype=torch.float64))
    joint = Sphere(layer="joint", rank_every=0).network_loss(out)
    phis = [out.phi(layer=i) for i in range(2)]
    torch.testing.assert_close(joint, brute(torch.cat(phis, dim=1)))
    every = Sphere(layer="all", rank_every=0).network_loss(out)
    torch.testing.assert_close(every, brute(phis[0]) + brute(phis[1]))


def _ctx(policy, out, losses, phase="ppo") -> LossContext:
    algo = types.SimpleNamespace(policy=policy)
    zero = out.out.new_zeros(())
    refs = {"actor": losses.get("actor", zero), "critic": losses.get("value", zero)}
    if phase != "ppo":
        refs = {"actor": losses.get("actor", zero)}
    return loss_context(algo, phase, None, {"actor": (out,)}, refs, losses)


def _policy(**kw) -> MoEActorCriticPolicy:
    obs, act = spaces.Box(-1, 1, (5,), np.float32), spaces.Box(-1, 1, (2,), np.float32)
    return MoEActorCriticPolicy(obs, act, lambda _: 1e-3, n_experts=4, top_k=2, hidden=(16, 16), **kw)


def test_adaptive_coefficient_is_ratio_of_gradient_norms() -> None:
    torch.manual_seed(5)
    policy = _policy()
    out = policy.actor_net(torch.randn(32, 5))
    actor_loss = (out.out**2).mean() + out.out.sum() * 0.1
    params = list(policy.actor_net.parameters())
    pen = Sphere(rho=0.3, rank_every=0).penalty(_ctx(policy, out, {"actor": actor_loss}))
    (term,) = pen
    assert term.name == "sphere"
    # Independent computation: dense Phi, separate autograd passes.
    l_s = brute(out.phi())
    torch.testing.assert_close(term.loss, l_s, rtol=1e-5, atol=1e-6)
    g_a = torch.autograd.grad(actor_loss, params, retain_graph=True, allow_unused=True)
    g_s = torch.autograd.grad(l_s, params, retain_graph=True, allow_unused=True)
    norm = lambda gs: torch.sqrt(sum((g**2).sum() for g in gs if g is not None))
    assert term.scale is not None and term.scale.reference is actor_loss
    assert scaled_coef(term) == pytest.approx(0.3 * float(norm(g_a) / (norm(g_s) + 1e-8)), rel=1e-4)
    # Sign flip and the other coefficient modes.
    (neg,) = Sphere(rho=-0.3, rank_every=0).penalty(_ctx(policy, out, {"actor": actor_loss}))
    assert scaled_coef(neg) == pytest.approx(-scaled_coef(term), rel=1e-6)
    (fixed,) = Sphere(rho=0.02, coef_mode="fixed").penalty(_ctx(policy, out, {"actor": actor_loss}))
    assert fixed.coef == 0.02
    (ratio,) = Sphere(rho=0.5, coef_mode="loss_ratio").penalty(_ctx(policy, out, {"actor": actor_loss}))
    assert ratio.coef == pytest.approx(0.5 * abs(float(actor_loss.detach())) / (float(l_s.detach()) + 1e-8), rel=1e-5)


def _brute_gradient_gram(out, per_sample: torch.Tensor, site: torch.Tensor) -> torch.Tensor:
    """SPHERE on Psi built by brute force: one backward per state, each row d l_i / d ``site`` of
    the experts that state was routed to."""
    g = out.groups[0]
    rows = torch.zeros_like(site)
    for i in range(per_sample.shape[0]):
        (gi,) = torch.autograd.grad(per_sample[i], site, retain_graph=True)
        mask = g.dispatch.sample_idx == i
        rows[mask] = gi[mask]
    return brute(dense_phi([FeatureBlock(g.dispatch, rows)]))


def test_gradient_gram_matches_per_sample_autograd() -> None:
    torch.manual_seed(6)
    net = _net("topk", hidden=(8, 6), n_experts=3).double()
    x = torch.randn(7, 6, dtype=torch.float64)
    out = net(x)
    per_sample = (out.out**2).sum(1) + out.out[:, 0]  # (N,) independent per state
    loss = per_sample.mean()
    value = Sphere(gram="gradients").network_loss(out, loss)
    torch.testing.assert_close(value, _brute_gradient_gram(out, per_sample, out.groups[0].expert.pre[-1]))
    # Differentiable (second order) and "both" adds the feature term.
    assert torch.autograd.grad(value, net.experts.weights[-1], retain_graph=True)[0].abs().sum() > 0
    both = Sphere(gram="both", rank_every=0).network_loss(out, loss)
    torch.testing.assert_close(both, value + brute(out.phi()))


def test_config_validation_and_suite_rho() -> None:
    from rl_moe.continual.resolve import RunRequest, resolve
    from rl_moe.envs.suites import load_suite

    # Table 2's per-suite rho comes from the suite files; hb5 is read without resolving (that
    # needs HumanoidBench installed).
    assert resolve(RunRequest(suite="cw10-cw", tasks=1, device="cpu")).regularizers["sphere"].rho == 0.1
    assert load_suite("hb5").regularizers["sphere"]["rho"] == 1e-3
    assert Sphere(rho=1e-3, placement="critic").config == sphere_config(rho=1e-3, placement="critic")
    for bad in (dict(placement="gate"), dict(layer="first"), dict(coef_mode="auto"), dict(gram="kron")):
        with pytest.raises(ValueError, match="valid choices"):
            SphereConfig(**bad)
    with pytest.raises(ValueError, match="valid choices"):
        sphere_config(rhoo=1.0)
    with pytest.raises(ValueError, match="valid choices"):
        make_regularizer("sphere", rhoo=1.0)


def _train_ppo(regs, seed: int = 3) -> list[torch.Tensor]:
    from rl_moe.algos import MoEPPO

    model = MoEPPO(
        MoEActorCriticPolicy, gym.make("Pendulum-v1"), regularizers=regs, n_steps=64, batch_size=32, n_epochs=2,
        policy_kwargs=dict(n_experts=4, top_k=2, hidden=(16, 16)), seed=seed,
    )
    model.learn(128)
    return [p.detach().clone() for p in model.policy.parameters()]


def test_rho_zero_is_bit_identical_to_unregularized() -> None:
    base = _train_ppo([])
    zero = _train_ppo([Sphere(rho=0.0)])
    assert all(torch.equal(a, b) for a, b in zip(base, zero))
    regularized = _train_ppo([Sphere(rho=0.1)])
    assert not all(torch.equal(a, b) for a, b in zip(base, regularized))


def test_td3_critic_placement_uses_critic_loss_and_every_q_network() -> None:
    from rl_moe.policies import MoETD3Policy

    torch.manual_seed(7)
    obs, act = spaces.Box(-1, 1, (5,), np.float32), spaces.Box(-1, 1, (2,), np.float32)
    policy = MoETD3Policy(obs, act, lambda _: 1e-3, n_experts=3, top_k=2, hidden=(16, 16))
    x, a = torch.randn(20, 5), torch.rand(20, 2) * 2 - 1
    outs = policy.critic.forward_with_outputs(x, a)
    critic_loss = sum((o.out - 1.0).pow(2).mean() for o in outs)
    ctx = loss_context(
        types.SimpleNamespace(policy=policy), "td3_critic", None, {"critic": outs}, {"critic": critic_loss}, {"critic": critic_loss}
    )
    assert Sphere().penalty(ctx) == []  # actor placement: nothing in the critic phase
    (term,) = Sphere(placement="critic", rho=0.2, rank_every=0).penalty(ctx)
    l_s = brute(outs[0].phi()) + brute(outs[1].phi())
    torch.testing.assert_close(term.loss, l_s, rtol=1e-5, atol=1e-6)
    params = list(policy.critic.q_nets.parameters())
    norm = lambda loss: torch.sqrt(
        sum((g**2).sum() for g in torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True) if g is not None)
    )
    assert scaled_coef(term) == pytest.approx(0.2 * float(norm(critic_loss) / (norm(l_s) + 1e-8)), rel=1e-4)


def test_ratio_every_reuses_the_last_ratio() -> None:
    torch.manual_seed(8)
    policy = _policy()
    reg = Sphere(rho=1.0, ratio_every=3, rank_every=0)
    coefs, resolved = [], []
    for _ in range(4):
        out = policy.actor_net(torch.randn(16, 5))
        loss = (out.out**2).mean()
        term = reg.penalty(_ctx(policy, out, {"actor": loss}))[0]
        resolved.append(term.scale is not None)  # a refresh: the learner resolves the ratio
        coefs.append(scaled_coef(term))
    assert resolved == [True, False, False, True]
    assert coefs[0] == coefs[1] == coefs[2] != coefs[3]


def test_full_loads_in_any_sample_order() -> None:
    # Every expert sees every sample but in a shuffled order: must not take the in-order shortcut.
    torch.manual_seed(9)
    n, e, h = 12, 3, 4
    d = Dispatch(
        torch.cat([torch.randperm(n) for _ in range(e)]), torch.arange(e).repeat_interleave(n),
        torch.rand(n * e, dtype=torch.float64), (n,) * e, n,
    )
    block = FeatureBlock(d, torch.randn(n * e, h, dtype=torch.float64), d.weight)
    torch.testing.assert_close(sphere_value(gram_stats([block], "sample")), brute(dense_phi([block])))


def _phi_block(phi: torch.Tensor) -> FeatureBlock:
    n = phi.shape[0]
    d = Dispatch(torch.arange(n), torch.zeros(n, dtype=torch.long), torch.ones(n, dtype=phi.dtype), (n,), n)
    return FeatureBlock(d, phi)


def test_raw_penalty_shrinks_features_when_n_below_m_and_the_scale_invariant_one_does_not() -> None:
    # L is homogeneous of degree 4 in Phi, so <dL/dPhi, Phi> = 4 L > 0: a gradient step always
    # shrinks Phi, and with N < m the bound L >= tr(A)^2 (1/N - 1/m) leaves Phi = 0 as the only
    # minimiser (docs/regularizers.md, "SPHERE's scale on MetaWorld"). The scale-invariant
    # variant is homogeneous of degree 0: <dL/dPhi, Phi> = 0 and L(c Phi) = L(Phi).
    torch.manual_seed(4)
    n, m = 8, 24
    phi = torch.randn(n, m, dtype=torch.float64, requires_grad=True)
    raw = sphere_value(gram_stats([_phi_block(phi)], "sample"))
    (g_raw,) = torch.autograd.grad(raw, phi)
    raw = raw.detach()
    assert float((g_raw * phi).sum()) == pytest.approx(4 * float(raw))
    a = phi.detach().t() @ phi.detach() / n
    assert float(raw) >= float(a.trace()) ** 2 * (1 / n - 1 / m) - 1e-12
    inv = sphere_value(gram_stats([_phi_block(phi)], "sample"), scale_invariant=True)
    (g_inv,) = torch.autograd.grad(inv, phi)
    inv = inv.detach()
    assert abs(float((g_inv * phi).sum())) < 1e-10
    assert float(inv) == pytest.approx(float(brute(phi.detach())) / float(a.trace()) ** 2)
    for c in (1e-3, 7.0):
        scaled = sphere_value(gram_stats([_phi_block(c * phi.detach())], "feature"), scale_invariant=True)
        assert float(scaled) == pytest.approx(float(inv), rel=1e-9)
    # Its minimum over rank-N Grams: N equal eigenvalues, ||A||^2 / tr^2 = 1/N, so 1/N - 1/m.
    q, _ = torch.linalg.qr(torch.randn(m, n, dtype=torch.float64))
    equal = sphere_value(gram_stats([_phi_block(3.0 * q.t())], "sample"), scale_invariant=True)
    assert float(equal) == pytest.approx(1 / n - 1 / m)
    # A zero Gram (an idle expert) gives 0 and a finite gradient.
    zero = torch.zeros(n, m, dtype=torch.float64, requires_grad=True)
    val = sphere_value(gram_stats([_phi_block(zero)], "sample"), scale_invariant=True)
    (g0,) = torch.autograd.grad(val, zero)
    val = val.detach()
    assert float(val) == 0.0 and torch.isfinite(g0).all()


def test_scale_invariant_config() -> None:
    assert Sphere(scale_invariant=True).config.scale_invariant
    with pytest.raises(ValueError, match="scale_invariant"):
        SphereConfig(scale_invariant=True, alpha=1.0)
    # Per-expert penalties normalise each expert's own Gram.
    torch.manual_seed(5)
    d = _top1_dispatch(8, 2)
    feats = torch.randn(8, 5, dtype=torch.float64)
    block = FeatureBlock(d, feats, d.weight.to(torch.float64))
    per = [sphere_value(s, scale_invariant=True) for s in per_expert_stats([block])]
    for e, value in enumerate(per[0]):
        rows = feats[d.expert_idx == e]
        a = rows.t() @ rows / 8
        expected = (a.pow(2).sum() - a.trace() ** 2 / 5) / a.trace() ** 2
        assert float(value) == pytest.approx(float(expected))


def test_one_adaptive_formula_with_the_learners_zero_gradient_guard() -> None:
    """scaled_coef reports the learner's formula (adaptive_coef): 0 for a penalty without a
    gradient, rho * ||g_ref|| / (||g_pen|| + eps) otherwise."""
    from rl_moe.regularizers.hooks import GradScale, Penalty, adaptive_coef

    w = torch.nn.Parameter(torch.tensor([3.0, 4.0]))
    reference = (w**2).sum()  # gradient (6, 8): norm 10
    flat = Penalty("flat", w.sum() * 0.0 + 1.0, 0.0, scale=GradScale(rho=0.5, reference=reference, params=(w,)))
    assert scaled_coef(flat) == 0.0  # not 0.5 * 10 / 1e-8
    linear = Penalty("linear", 2.0 * w[0], 0.0, scale=GradScale(rho=0.5, reference=reference, params=(w,)))
    assert scaled_coef(linear) == pytest.approx(0.5 * 10.0 / (2.0 + 1e-8))
    assert float(adaptive_coef(0.5, torch.tensor(10.0), torch.tensor(0.0), 1e-8)) == 0.0


def test_gate_term_known_answers_and_coefficient() -> None:
    """The authors' routing-weight term: 0 for balanced one-hot routing, (1 - 1/E)/E when all
    states go to one expert; off by default, on with gating_ratio, scaled like the main term."""
    from rl_moe.regularizers.sphere import gate_loss

    e = 4
    balanced = torch.eye(e).repeat(8, 1)  # (32, 4): every expert takes a quarter, one-hot
    assert float(gate_loss(balanced)) == pytest.approx(0.0, abs=1e-12)
    collapsed = torch.zeros(32, e)
    collapsed[:, 0] = 1.0
    assert float(gate_loss(collapsed)) == pytest.approx((1 - 1 / e) / e)
    torch.manual_seed(0)
    policy = _policy()
    out = policy.actor_net(torch.randn(64, 5))
    actor_loss = (out.out**2).mean()
    assert [t.name for t in Sphere(rank_every=0).penalty(_ctx(policy, out, {"actor": actor_loss}))] == ["sphere"]
    terms = Sphere(rho=0.5, gating_ratio=0.2, coef_mode="loss_ratio", rank_every=0).penalty(_ctx(policy, out, {"actor": actor_loss}))
    assert [t.name for t in terms] == ["sphere", "sphere_gate"]
    gate = terms[1]
    torch.testing.assert_close(gate.loss, gate_loss(out.probs))
    assert gate.coef == pytest.approx(0.2 * abs(float(actor_loss.detach())) / (float(gate.loss.detach()) + 1e-8), rel=1e-5)
    (_, adaptive) = Sphere(gating_ratio=0.2, rank_every=0).penalty(_ctx(policy, out, {"actor": actor_loss}))
    assert adaptive.scale is not None and adaptive.scale.rho == 0.2


def test_lambda_watch_warns_once_when_it_stays_high(capsys: pytest.CaptureFixture) -> None:
    sphere = Sphere(rho=0.1, warn_coef=100.0, warn_updates=3, rank_every=0)
    for _ in range(5):  # the learner hands over each update's logged means
        sphere.logged({"train/loss_sphere": 1e-12, "train/coef_sphere": 500.0, "train/coef_sphere_gate": 1.0})
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "stayed above 100 for 3 updates" in err[0] and "max_coef" in err[0]
    sphere.logged({"train/coef_sphere": 1.0})  # the streak ends
    assert sphere._high_updates == 0
    with pytest.raises(ValueError, match="pcgrad"):
        Sphere(pcgrad=True, coef_mode="loss_ratio")
    capped = Sphere(rho=0.5, coef_mode="loss_ratio", max_coef=0.01, rank_every=0)
    assert capped._coefficient("actor", torch.tensor(10.0), torch.tensor(1e-6)) == pytest.approx(0.01)


def test_the_trace_ratio_is_against_the_fresh_network_and_every_moe_run_logs_the_trace(tmp_path) -> None:
    """``train/sphere_trace_ratio`` divides by tr(A_last) of the run's first minibatch, the fresh
    network's features before any step (issue 72: it divided by the first update's last minibatch,
    already penalized). ``train/feature_trace`` is the same quantity logged by the learner for
    every MoE actor, SPHERE or not: SPHERE's curve and its control."""
    import copy

    from rl_moe.regularizers import make_regularizer
    from tests.conftest import moe_ppo

    reg = make_regularizer("sphere", rho=0.1, rank_every=0)
    model = moe_ppo(regularizers=[reg], batch_size=128, n_epochs=3)  # 2 envs x 64 steps: one minibatch per epoch
    fresh = copy.deepcopy(model.policy)
    model.learn(128)
    obs = torch.as_tensor(model.rollout_buffer.observations.reshape(128, -1))
    with torch.no_grad():
        want = float(fresh.actor_net(obs).feature_trace())
    assert reg._trace0 == pytest.approx(want, rel=1e-5)
    logs = reg.logs()
    assert logs["sphere_trace_ratio"] == pytest.approx(logs["sphere_trace"] / want, rel=1e-5)
    assert abs(logs["sphere_trace_ratio"] - 1.0) > 1e-3  # three penalized steps moved it: the old baseline gave exactly 1 here


def _scalars_of(run):
    from rl_moe.fingerprint import scalars

    return scalars(run)


@pytest.mark.parametrize("method", ["topk", "sphere"])
def test_every_moe_run_logs_the_feature_trace_and_sphere_s_equals_it(method: str, tmp_path) -> None:
    from rl_moe.crl import main
    from tests.conftest import CLI_TINY

    run = tmp_path / "run"
    assert main(["--suite", "smoke", "--method", method, "--tasks", "1", "--steps-per-task", "384", *CLI_TINY, "--run-dir", str(run)]) == 0
    tags = _scalars_of(run)
    trace = [v for _, v in tags["train/feature_trace"]]
    assert len(trace) >= 2 and all(v > 0 for v in trace)
    if method == "sphere":  # the learner's and SPHERE's reading of the same last minibatch
        assert trace == pytest.approx([v for _, v in tags["train/sphere_trace"]], rel=1e-5)


def _skewed_block(scale: bool, static: bool = False, counts: tuple[int, ...] = (1, 1, 2, 9, 10, 0), h: int = 4) -> tuple[FeatureBlock, list[torch.Tensor]]:
    """A hand-made dispatch of its N = sum(counts) states routed top-1 with skewed counts, or the
    static layout (3 experts on every one of 23 states); and each expert's scaled rows."""
    from rl_moe.nn import Dispatch

    torch.manual_seed(5)
    n = 23 if static else sum(counts)
    if static:
        e = 3
        weight = torch.rand(e * n, dtype=torch.float64) * (torch.rand(e * n) < 0.6)  # unselected pairs weigh 0
        idx = torch.arange(e).repeat_interleave(n)
        d = Dispatch(sample_idx=torch.arange(n).repeat(e), expert_idx=idx, weight=weight, counts=(n,) * e, n_samples=n, static=True)
    else:
        idx = torch.arange(len(counts)).repeat_interleave(torch.tensor(counts))
        weight = torch.rand(n, dtype=torch.float64)
        d = Dispatch(sample_idx=torch.randperm(n), expert_idx=idx, weight=weight, counts=counts, n_samples=n)
    feats = torch.randn(len(idx), h, dtype=torch.float64)
    block = FeatureBlock(d, feats, weight if scale else None)
    scaled = block.scaled()
    return block, [scaled[idx == e] for e in range(len(d.counts))]


@pytest.mark.parametrize(("scale", "static"), [(False, False), (True, False), (True, True)])
def test_per_expert_grams_against_brute_force_over_padded_buckets_and_the_static_layout(scale: bool, static: bool) -> None:
    from rl_moe.regularizers.gram_kernels import _plan

    block, rows = _skewed_block(scale, static, counts=(1, 1, 2, 120, 130, 0), h=16)
    n = block.dispatch.n_samples
    if not static:
        assert len(_plan(block.dispatch, 16).shapes) >= 2  # the skewed counts fill two padded buckets
    (stats,) = per_expert_stats([block])
    grams = [r.t() @ r / n for r in rows if len(r)]
    want_fro2 = torch.stack([g.pow(2).sum() for g in grams])
    want_trace = torch.stack([g.diagonal().sum() for g in grams])
    assert stats.fro2.shape == stats.trace.shape == (len(grams),)  # one value per active expert
    assert (stats.dim, stats.n, stats.gram.numel()) == (16, n, 0)
    if static:  # expert order
        torch.testing.assert_close(stats.fro2, want_fro2)
        torch.testing.assert_close(stats.trace, want_trace)
    else:  # bucket order
        torch.testing.assert_close(stats.fro2.sort().values, want_fro2.sort().values)
        torch.testing.assert_close(stats.trace.sort().values, want_trace.sort().values)


def test_gram_space_choice_and_its_errors() -> None:
    """auto: the sample space when m > N (the feature space otherwise); both give the same
    ||A||_F² and tr(A); an unknown space is one line naming the choices."""
    block, _ = _skewed_block(scale=True)  # m = 6 experts x 4 = 24 > N = 23
    sample, feature = gram_stats([block], "auto"), gram_stats([block], "feature")
    assert sample.gram.shape == (23, 23) and feature.gram.shape == (24, 24) and sample.n == feature.n == 23
    torch.testing.assert_close(sample.fro2, feature.fro2)
    torch.testing.assert_close(sample.trace, feature.trace)
    tall, _ = _skewed_block(scale=True, counts=(1, 1, 2, 120, 130, 0), h=16)  # m = 96 < N = 254
    assert gram_stats([tall], "auto").gram.shape == (96, 96)
    with pytest.raises(ValueError) as err:
        gram_stats([block], "dual")
    assert str(err.value) == "unknown Gram space 'dual'; valid choices: auto, sample, feature"


def _full_block(n_experts: int = 3, n: int = 20, h: int = 4) -> FeatureBlock:
    """Every expert on every state, rows expert-major in sample order (the full layout)."""
    from rl_moe.nn import Dispatch

    torch.manual_seed(7)
    d = Dispatch(sample_idx=torch.arange(n).repeat(n_experts), expert_idx=torch.arange(n_experts).repeat_interleave(n),
                 weight=torch.rand(n_experts * n, dtype=torch.float64), counts=(n,) * n_experts, n_samples=n)  # fmt: skip
    return FeatureBlock(d, torch.randn(n_experts * n, h, dtype=torch.float64), d.weight)


@pytest.mark.parametrize("case", ["loop", "buckets_many_loads", "two_stacks", "full", "routed_then_full"])
def test_sample_space_gram_against_brute_force_on_every_kernel_path(case: str) -> None:
    """The sample-space Gram G = Φ Φᵀ / N, its ||G||_F² and tr(G), whichever kernel builds it: the
    per-expert loop (≤ 48 active experts), padded buckets over 50 distinct loads (merged levels),
    two stacks at once, the full layout, and a full stack added after a routed one."""
    from rl_moe.regularizers.gram_kernels import _is_full, sample_gram_stats

    if case == "loop":
        blocks = [_skewed_block(True, counts=(1, 1, 2, 120, 130, 0), h=16)[0]]
    elif case == "buckets_many_loads":
        blocks = [_skewed_block(True, counts=tuple(range(1, 51)), h=4)[0]]
    elif case == "two_stacks":
        blocks = [_skewed_block(True, counts=(1, 1, 2, 120, 130, 0), h=16)[0], _skewed_block(False, counts=(40, 80, 134), h=8)[0]]
    elif case == "routed_then_full":  # a DS-MoE's routed stack, then its shared one (every expert on every state)
        blocks = [_skewed_block(True, counts=(5, 15), h=4)[0], _full_block(n=20)]
    else:
        blocks = [_full_block()]
        assert _is_full(blocks[0].dispatch)
    assert case == "full" or not _is_full(blocks[0].dispatch)
    phi = dense_phi(blocks)
    g = phi @ phi.t() / phi.shape[0]
    fro2, trace, gram = sample_gram_stats(blocks)
    torch.testing.assert_close(gram, g)
    torch.testing.assert_close(fro2, g.pow(2).sum())
    torch.testing.assert_close(trace, g.diagonal().sum())


# --- The hook's settings and bookkeeping: what reaches the learner, what is logged, what is saved ---

from rl_moe.regularizers.sphere import _coef_loss_ratio, gate_loss, is_collapsed  # noqa: E402
from rl_moe.regularizers.sphere_config import COEF_MODES, FEATURES, GRAD_SITES, GRAMS, LAYERS, SPACES  # noqa: E402

_CHOICES = {"coef_mode": COEF_MODES, "layer": LAYERS, "features": FEATURES, "gram": GRAMS, "grad_site": GRAD_SITES, "space": SPACES}


def test_sphere_choices_are_the_documented_names() -> None:
    # The names users pass to --set reg.sphere.<field> (docs/regularizers.md).
    assert _CHOICES == {
        "coef_mode": ("adaptive", "fixed", "loss_ratio"), "layer": ("last", "all", "joint"), "features": ("weighted", "unweighted"),
        "gram": ("features", "gradients", "both"), "grad_site": ("hidden", "head"), "space": ("auto", "sample", "feature"),
    }  # fmt: skip


@pytest.mark.parametrize("field", sorted(_CHOICES))
def test_sphere_config_takes_every_choice_and_names_them_for_a_bad_one(field: str) -> None:
    for value in _CHOICES[field]:
        assert getattr(SphereConfig(**{field: value}), field) == value
    with pytest.raises(ValueError) as err:
        SphereConfig(**{field: "bogus"})
    assert str(err.value) == f"unknown {field} 'bogus'; valid choices: {', '.join(_CHOICES[field])}"
    with pytest.raises(ValueError) as err:
        SphereConfig(placement="gate")
    assert str(err.value) == "unknown placement 'gate'; valid choices: actor, critic, both"


def test_sphere_defaults_are_the_papers_setup_with_the_authors_arithmetic() -> None:
    assert SphereConfig().to_dict() == {
        "rho": 0.1, "coef_mode": "adaptive", "placement": "actor", "layer": "last", "features": "weighted", "per_expert": False,
        "gram": "features", "grad_site": "hidden", "alpha": None, "scale_invariant": False, "space": "auto", "eps": 1e-8,
        "norm_eps": 1e-8, "log_std_in_theta": True, "rank_every": 50, "ratio_every": 1, "gating_ratio": 0.0, "max_coef": None,
        "pcgrad": False, "warn_coef": 1e4, "warn_updates": 20,
    }  # fmt: skip
    import dataclasses

    with pytest.raises(ValueError) as err:
        sphere_config(rhoo=1.0)
    names = ", ".join(f.name for f in dataclasses.fields(SphereConfig))
    assert str(err.value) == f"unknown SPHERE option 'rhoo'; valid choices: {names}"


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(max_coef=0.0), "max_coef must be > 0 or null, got 0.0"),
        (dict(max_coef=-2.0), "max_coef must be > 0 or null, got -2.0"),
        (dict(pcgrad=True, coef_mode="fixed"), "pcgrad projects gradients, which coef_mode 'adaptive' computes; got coef_mode='fixed'"),
        (dict(norm_eps=-1e-9), "norm_eps must be >= 0, got -1e-09"),
        (dict(warn_updates=0), "warn_updates must be >= 1, got 0"),
        (dict(rank_every=-1), "rank_every must be >= 0, got -1"),
        (dict(ratio_every=0), "ratio_every must be >= 1, got 0"),
        (dict(scale_invariant=True, alpha=0.5), "scale_invariant penalises no scale, alpha=0.5 fixes one; set one of them"),
    ],
)
def test_sphere_config_range_errors_name_the_value(bad: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        SphereConfig(**bad)
    assert str(err.value) == message


@pytest.mark.parametrize(
    "edge",
    [dict(max_coef=1e-12), dict(norm_eps=0.0), dict(warn_updates=1), dict(rank_every=0), dict(ratio_every=1), dict(pcgrad=True),
     dict(alpha=0.5), dict(scale_invariant=True), dict(alpha=0.0, coef_mode="fixed")],
)  # fmt: skip
def test_sphere_config_accepts_each_bound(edge: dict) -> None:
    cfg = SphereConfig(**edge)
    assert all(getattr(cfg, k) == v for k, v in edge.items())


def _both_ctx(policy, x: torch.Tensor, sync_free: bool = False):
    """A PPO minibatch context with a MoE actor and a MoE critic and their reference losses."""
    out_a, out_c = policy.actor_net(x), policy.critic_net(x)
    actor_loss, value_loss = (out_a.out**2).mean() + out_a.out.sum() * 0.1, (out_c.out - 1.0).pow(2).mean()
    ctx = loss_context(
        types.SimpleNamespace(policy=policy), "ppo", None, {"actor": (out_a,), "critic": (out_c,)},
        {"actor": actor_loss, "critic": value_loss}, {"actor": actor_loss, "value": value_loss}, sync_free,
    )  # fmt: skip
    return ctx, out_a, out_c


def test_sphere_hands_its_settings_to_the_learners_scale_for_each_role() -> None:
    torch.manual_seed(11)
    policy = _policy(critic_moe=True)
    ctx, out_a, out_c = _both_ctx(policy, torch.randn(24, 5))
    reg = Sphere(rho=0.3, placement="both", eps=1e-6, norm_eps=1e-7, max_coef=5.0, pcgrad=True, rank_every=0)
    actor, critic = reg.penalty(ctx)
    assert (actor.name, critic.name) == ("sphere_actor", "sphere_critic")
    for term, out, ref in ((actor, out_a, ctx.roles["actor"].reference), (critic, out_c, ctx.roles["critic"].reference)):
        s = term.scale
        assert s is not None and (s.rho, s.eps, s.norm_eps, s.ceiling, s.pcgrad) == (0.3, 1e-6, 1e-7, 5.0, True)
        assert s.reference is ref and term.coef == 0.0
        torch.testing.assert_close(term.loss, brute(out.phi()), rtol=1e-5, atol=1e-6)
    # theta: the actor's experts and gate plus its log-std (the authors' whole actor tree); the critic's own parameters.
    assert actor.scale.params == (*ctx.roles["actor"].params, policy.log_std)
    assert critic.scale.params == ctx.roles["critic"].params
    assert Sphere(log_std_in_theta=False, rank_every=0).penalty(ctx)[0].scale.params == ctx.roles["actor"].params
    # The resolved lambda comes back per role and is kept as lambda / rho.
    actor.scale.on_resolve(torch.tensor(0.6))
    critic.scale.on_resolve(torch.tensor(0.9))
    assert float(reg._ratios["actor"]) == pytest.approx(2.0) and float(reg._ratios["critic"]) == pytest.approx(3.0)
    assert reg._calls == 1


def test_sphere_rho_zero_adds_its_loss_with_coefficient_zero_in_every_mode() -> None:
    torch.manual_seed(12)
    policy = _policy()
    out = policy.actor_net(torch.randn(24, 5))
    ctx = _ctx(policy, out, {"actor": (out.out**2).mean()})
    for mode in COEF_MODES:
        (term,) = Sphere(rho=0.0, coef_mode=mode, rank_every=0).penalty(ctx)
        assert term.scale is None and isinstance(term.coef, float) and term.coef == 0.0
        torch.testing.assert_close(term.loss, brute(out.phi()), rtol=1e-5, atol=1e-6)


def test_sphere_skips_a_role_without_moe_output_but_counts_the_call() -> None:
    policy = _policy()  # dense critic: no MoE output to penalise
    out = policy.actor_net(torch.randn(8, 5))
    ctx = loss_context(types.SimpleNamespace(policy=policy), "ppo", None, {}, {"actor": out.out.sum(), "critic": out.out.sum()}, {})
    reg = Sphere(placement="both", gating_ratio=0.5, rank_every=0)
    assert reg.penalty(ctx) == [] and reg._calls == 1
    assert reg.logs() == {}


def test_sphere_reused_ratio_keeps_the_sign_of_rho_and_the_ceiling() -> None:
    torch.manual_seed(13)
    policy = _policy()
    for rho in (1.0, -1.0):
        reg = Sphere(rho=rho, ratio_every=2, max_coef=0.5, rank_every=0)
        x = torch.randn(16, 5)
        out = policy.actor_net(x)
        first = reg.penalty(_ctx(policy, out, {"actor": (out.out**2).mean()}))[0]
        first.scale.on_resolve(torch.tensor(4.0 * rho))  # the learner's lambda: rho * ratio, ratio 4
        second = reg.penalty(_ctx(policy, out, {"actor": (out.out**2).mean()}))[0]
        assert second.scale is None and float(second.coef) == pytest.approx(0.5 * rho)
        unclamped = Sphere(rho=rho, ratio_every=2, rank_every=0)
        unclamped._ratios["actor"] = 4.0
        unclamped._calls = 1
        assert float(unclamped.penalty(_ctx(policy, out, {"actor": (out.out**2).mean()}))[0].coef) == pytest.approx(4.0 * rho)


def test_sphere_gate_terms_follow_the_coefficient_mode_for_each_role() -> None:
    torch.manual_seed(14)
    policy = _policy(critic_moe=True)
    ctx, out_a, out_c = _both_ctx(policy, torch.randn(32, 5))
    terms = Sphere(placement="both", gating_ratio=0.2, eps=1e-6, norm_eps=1e-7, rank_every=0).penalty(ctx)
    assert [t.name for t in terms] == ["sphere_actor", "sphere_critic", "sphere_actor_gate", "sphere_critic_gate"]
    for gate, out, role in ((terms[2], out_a, "actor"), (terms[3], out_c, "critic")):
        torch.testing.assert_close(gate.loss, gate_loss(out.probs))
        s = gate.scale
        assert s is not None and (s.rho, s.eps, s.norm_eps, s.ceiling, s.pcgrad) == (0.2, 1e-6, 1e-7, None, False)
        assert s.reference is ctx.roles[role].reference
    assert terms[2].scale.params == (*ctx.roles["actor"].params, policy.log_std)
    assert terms[3].scale.params == ctx.roles["critic"].params
    fixed = Sphere(placement="both", coef_mode="fixed", gating_ratio=0.2, rank_every=0).penalty(ctx)
    assert [t.coef for t in fixed[2:]] == [0.2, 0.2]


def test_sphere_gate_term_sums_over_every_q_network() -> None:
    from rl_moe.policies import MoETD3Policy

    torch.manual_seed(15)
    obs, act = spaces.Box(-1, 1, (5,), np.float32), spaces.Box(-1, 1, (2,), np.float32)
    policy = MoETD3Policy(obs, act, lambda _: 1e-3, n_experts=3, top_k=2, hidden=(16, 16))
    outs = policy.critic.forward_with_outputs(torch.randn(20, 5), torch.rand(20, 2) * 2 - 1)
    loss = sum((o.out - 1.0).pow(2).mean() for o in outs)
    ctx = loss_context(types.SimpleNamespace(policy=policy), "td3_critic", None, {"critic": outs}, {"critic": loss}, {"critic": loss})
    main, gate = Sphere(placement="critic", coef_mode="fixed", gating_ratio=0.1, rank_every=0).penalty(ctx)
    torch.testing.assert_close(gate.loss, gate_loss(outs[0].probs) + gate_loss(outs[1].probs))
    assert gate.name == "sphere_gate" and gate.coef == 0.1
    # TD3's policy has no log-std: theta is the role's parameters even under log_std_in_theta.
    adaptive = Sphere(placement="critic", rank_every=0).penalty(ctx)[0]
    assert adaptive.scale.params == ctx.roles["critic"].params


def test_the_gradient_gram_needs_its_reference_and_takes_the_head_site() -> None:
    torch.manual_seed(16)
    net = _net("topk", hidden=(8, 6), n_experts=3).double()
    out = net(torch.randn(7, 6, dtype=torch.float64))
    for gram in ("gradients", "both"):
        with pytest.raises(ValueError) as err:
            Sphere(gram=gram).network_loss(out)
        assert str(err.value) == f"gram={gram!r} needs the reference loss (the actor or critic loss); got reference=None"
    per_sample = (out.out**2).sum(1) + out.out[:, 1]
    value = Sphere(gram="gradients", grad_site="head").network_loss(out, per_sample.mean())
    torch.testing.assert_close(value, _brute_gradient_gram(out, per_sample, out.groups[0].expert.linear[-1]))
    # A reference that never reaches the experts (the gate alone) has zero gradient rows: penalty 0, no error.
    gate_only = Sphere(gram="gradients").network_loss(out, (out.probs**2).sum())
    assert float(gate_only) == 0.0


def test_sphere_per_expert_penalty_carries_alpha_and_scale_invariance() -> None:
    torch.manual_seed(17)
    net = _net("topk").double()
    out = net(torch.randn(30, 6, dtype=torch.float64))
    phi = out.phi()
    h = out.groups[0].expert.hidden[-1].shape[1]
    cols = [phi[:, e * h : (e + 1) * h] for e in range(5)]
    torch.testing.assert_close(Sphere(per_expert=True, alpha=0.3).network_loss(out), sum(brute(c, alpha=0.3) for c in cols))

    def normalised(c: torch.Tensor) -> torch.Tensor:
        a = c.t() @ c / c.shape[0]
        return torch.zeros(()) if a.trace() == 0 else brute(c) / a.trace() ** 2

    want = sum(normalised(c) for c in cols)
    torch.testing.assert_close(Sphere(per_expert=True, scale_invariant=True).network_loss(out), want.to(phi.dtype))


def _last_gram(out) -> torch.Tensor:
    return gram_stats(feature_blocks(out, (len(out.groups[0].expert.hidden) - 1,), True), "auto").gram


def test_sphere_logs_the_last_layers_trace_and_rank_under_last_and_all_but_not_joint() -> None:
    torch.manual_seed(18)
    net = _net("topk").double()
    out = net(torch.randn(30, 6, dtype=torch.float64))
    gram = _last_gram(out)
    for layer in ("last", "all"):
        reg = Sphere(layer=layer, rank_every=1)
        reg.network_loss(out)
        logs = reg.logs()
        assert logs["sphere_trace"] == pytest.approx(float(gram.trace()))
        assert logs["sphere_feature_rank"] == pytest.approx(effective_rank(gram))
        assert logs["sphere_trace_ratio"] == pytest.approx(1.0)
    joint = Sphere(layer="joint", rank_every=1)
    joint.network_loss(out)
    assert joint.logs() == {}


def test_sphere_ranks_every_rank_every_calls_or_once_per_update_when_sync_free() -> None:
    torch.manual_seed(19)
    policy = _policy()
    xs = [torch.randn(24, 5) * (1 + i) for i in range(4)]
    outs = [policy.actor_net(x) for x in xs]
    ranks = [effective_rank(_last_gram(o)) for o in outs]
    assert len(set(round(r, 6) for r in ranks)) == 4  # four different answers, so a stale one shows
    reg = Sphere(rank_every=2)
    seen = []
    for out in outs:
        reg.penalty(_ctx(policy, out, {"actor": (out.out**2).mean()}))
        seen.append(reg.logs()["sphere_feature_rank"])
    assert seen == pytest.approx([ranks[0], ranks[0], ranks[2], ranks[2]])
    free = Sphere(rank_every=2)
    for out, want in zip(outs, ranks):  # sync-free: the latest Gram, ranked when logs() reads it
        free.penalty(_ctx_sync_free(policy, out))
        assert free.logs()["sphere_feature_rank"] == pytest.approx(want)
    never = Sphere(rank_every=0)
    never.penalty(_ctx_sync_free(policy, outs[0]))
    assert "sphere_feature_rank" not in never.logs()


def _ctx_sync_free(policy, out) -> LossContext:
    loss = (out.out**2).mean()
    return loss_context(types.SimpleNamespace(policy=policy), "ppo", None, {"actor": (out,)}, {"actor": loss, "critic": loss}, {"actor": loss}, True)


def test_sphere_trace_ratio_keeps_the_first_calls_baseline_across_calls_and_a_resume() -> None:
    torch.manual_seed(20)
    net = _net("topk").double()
    outs = [net(torch.randn(30, 6, dtype=torch.float64) * s) for s in (1.0, 2.0, 3.0)]
    traces = [float(_last_gram(o).trace()) for o in outs]
    reg = Sphere(rank_every=0)
    reg.network_loss(outs[0])
    reg.network_loss(outs[1])  # two calls before the update's logs: the baseline is the first
    logs = reg.logs()
    assert logs["sphere_trace"] == pytest.approx(traces[1])
    assert logs["sphere_trace_ratio"] == pytest.approx(traces[1] / traces[0])
    reg.network_loss(outs[2])
    assert reg.logs()["sphere_trace_ratio"] == pytest.approx(traces[2] / traces[0])
    returned = reg.logs()
    returned["sphere_trace"] = -1.0  # the caller's copy
    assert reg.logs()["sphere_trace"] == pytest.approx(traces[2])
    resumed = Sphere(rank_every=0)
    resumed.load_state_dict(reg.state_dict(None), None)
    resumed.network_loss(outs[1])
    assert resumed.logs()["sphere_trace_ratio"] == pytest.approx(traces[1] / traces[0])
    zero = Sphere(rank_every=0)
    zero.load_state_dict({"calls": 0, "ratios": {}, "trace0": 0.0}, None)
    zero.network_loss(outs[0])
    assert np.isnan(zero.logs()["sphere_trace_ratio"])


def test_sphere_state_round_trips_through_json_and_reads_older_checkpoints() -> None:
    import json

    torch.manual_seed(21)
    policy = _policy()
    reg = Sphere(rho=1.0, ratio_every=3, rank_every=1)
    out = policy.actor_net(torch.randn(16, 5))
    reg.penalty(_ctx(policy, out, {"actor": (out.out**2).mean()}))[0].scale.on_resolve(torch.tensor(4.0))
    reg.penalty(_ctx(policy, out, {"actor": (out.out**2).mean()}))
    logs = reg.logs()
    state = reg.state_dict(policy)
    assert state == {"calls": 2, "ratios": {"actor": 4.0}, "last": logs, "trace0": pytest.approx(logs["sphere_trace"])}
    loaded = Sphere(rho=1.0, ratio_every=3, rank_every=1)
    loaded.load_state_dict(json.loads(json.dumps(state)), policy)
    assert loaded.state_dict(policy) == state and isinstance(loaded._calls, int)
    # The third call reuses the saved ratio, in both.
    assert float(loaded.penalty(_ctx(policy, out, {"actor": (out.out**2).mean()}))[0].coef) == pytest.approx(4.0)
    older = Sphere(rank_every=0)
    older.load_state_dict({"calls": 5, "ratios": {"actor": 2}}, policy)  # saved before "last" and "trace0"
    assert older.logs() == {} and older._calls == 5 and older._ratios == {"actor": 2.0}
    older.network_loss(out)
    assert older.logs()["sphere_trace_ratio"] == pytest.approx(1.0)  # its baseline is taken afresh


def test_the_collapse_flag_reads_the_largest_lambda_and_the_smallest_penalty() -> None:
    assert not is_collapsed(1e4, 1e-8) and is_collapsed(1e4 + 1, 1.0) and is_collapsed(-2e4, 1.0)  # both bounds strict, |lambda|
    assert is_collapsed(0.0, 0.99e-8) and not is_collapsed(0.0, 0.5)
    reg = Sphere(rank_every=0)
    reg.logged({})
    assert "sphere_collapsed" not in reg.logs()

    def flag(values: dict[str, float]) -> float:
        reg.logged(values)
        return reg.logs()["sphere_collapsed"]

    assert flag({"train/coef_sphere_actor": 1.0, "train/coef_sphere_critic": 2e4, "train/loss_sphere_actor": 1.0, "train/loss_sphere_critic": 1.0}) == 1.0
    assert flag({"train/coef_sphere_actor": -2e4, "train/loss_sphere_actor": 1.0}) == 1.0
    assert flag({"train/coef_sphere": 1e4, "train/loss_sphere": 1e-8}) == 0.0
    assert flag({"train/coef_sphere": 1.0, "train/loss_sphere_actor": 1.0, "train/loss_sphere_critic": 1e-9}) == 1.0
    # The gate term and other methods' terms are not SPHERE's main penalty.
    assert flag({"train/coef_sphere": 1.0, "train/loss_sphere": 0.5, "train/coef_sphere_gate": 1e9, "train/loss_sphere_gate": 0.0}) == 0.0
    assert flag({"train/coef_ln": 1e9, "train/loss_ln": 0.0, "train/loss_sphere": 0.5}) == 0.0
    assert flag({"train/loss_sphere": 1e-9}) == 1.0  # no lambda logged: the penalty alone decides
    assert flag({"train/loss_sphere": 0.5}) == 0.0


def test_the_lambda_warning_needs_a_strict_unbroken_streak(capsys: pytest.CaptureFixture) -> None:
    reg = Sphere(warn_coef=100.0, warn_updates=3, rank_every=0)
    for coef in (100.0, 100.0, 100.0, 500.0, 500.0, 50.0, 500.0, 500.0):  # at the bound does not count; 50 breaks the streak
        reg.logged({"train/coef_sphere": coef, "train/loss_sphere": 1.0})
    assert capsys.readouterr().err == ""
    reg.logged({"train/coef_sphere_actor": 10.0, "train/coef_sphere_critic": -600.0, "train/loss_sphere_actor": 1.0})
    assert capsys.readouterr().err == (
        "warning: SPHERE's lambda has stayed above 100 for 3 updates (now 600): the actor's features are likely collapsing on "
        "a task it does not solve; see docs/regularizers.md, \"SPHERE's scale on MetaWorld\" (reg.sphere.max_coef, "
        "reg.sphere.scale_invariant=true)\n"
    )
    one = Sphere(warn_coef=100.0, warn_updates=1, rank_every=0)
    one.logged({"train/coef_sphere_gate": 1e9})  # the gate's lambda is not watched
    assert capsys.readouterr().err == ""
    one.logged({"train/coef_sphere": 101.0})
    assert "above 100 for 1 updates" in capsys.readouterr().err


def test_the_loss_ratio_rule_gives_zero_for_a_zero_penalty_and_uses_the_reference_size() -> None:
    assert float(_coef_loss_ratio(0.5, torch.tensor(-3.0), torch.tensor(0.0), 1e-8)) == 0.0
    assert float(_coef_loss_ratio(0.5, torch.tensor(-3.0), torch.tensor(2.0), 1e-8)) == pytest.approx(0.5 * 3.0 / (2.0 + 1e-8))
    assert float(_coef_loss_ratio(0.5, torch.tensor(3.0), torch.tensor(1e-12), 1e-8)) == pytest.approx(0.5 * 3.0 / (1e-12 + 1e-8))


def test_gate_loss_on_soft_routing_against_its_definition() -> None:
    e = 4
    uniform = torch.full((32, e), 1.0 / e)  # G = 1/E^2 everywhere: tr(G) = 1/E, ||G||^2 = 1/E^2
    assert float(gate_loss(uniform)) == pytest.approx((1 / e**2 - 1 / e**3) / e)
    torch.manual_seed(22)
    probs = torch.softmax(torch.randn(50, 6, dtype=torch.float64), dim=1)
    g = probs.T @ probs / 50
    torch.testing.assert_close(gate_loss(probs), ((g**2).sum() - g.trace() ** 2 / 6) / 6)


def test_sphere_names_itself_in_an_unknown_option_error() -> None:
    import dataclasses

    names = ", ".join(f.name for f in dataclasses.fields(SphereConfig))
    with pytest.raises(ValueError) as err:
        Sphere(rhoo=1.0)
    assert str(err.value) == f"unknown SPHERE option 'rhoo'; valid choices: {names}"


def test_a_role_without_moe_output_does_not_hide_the_next_role() -> None:
    torch.manual_seed(23)
    policy = _policy(actor_moe=False, critic_moe=True)  # dense actor, MoE critic
    x = torch.randn(24, 5)
    out_c = policy.critic_net(x)
    value_loss = (out_c.out - 1.0).pow(2).mean()
    ctx = loss_context(
        types.SimpleNamespace(policy=policy), "ppo", None, {"actor": (None,), "critic": (out_c,)},
        {"actor": value_loss * 0, "critic": value_loss}, {"value": value_loss},
    )  # fmt: skip
    terms = Sphere(placement="both", coef_mode="fixed", gating_ratio=0.3, rank_every=0).penalty(ctx)
    assert [t.name for t in terms] == ["sphere_critic", "sphere_critic_gate"]
    torch.testing.assert_close(terms[0].loss, brute(out_c.phi()), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(terms[1].loss, gate_loss(out_c.probs))


def test_sphere_penalty_names_each_role_and_hands_the_reference_to_the_gradient_gram() -> None:
    torch.manual_seed(24)
    policy = _policy(critic_moe=True)
    ctx, out_a, out_c = _both_ctx(policy, torch.randn(24, 5))
    fixed = Sphere(placement="both", coef_mode="fixed", rank_every=0).penalty(ctx)
    assert [(t.name, t.coef) for t in fixed] == [("sphere_actor", 0.1), ("sphere_critic", 0.1)]
    adaptive_gate = Sphere(gating_ratio=0.2, rank_every=0).penalty(ctx)[1]
    assert adaptive_gate.coef == 0.0  # a scaled term's coefficient is set by the learner
    reg = Sphere(placement="both", gram="gradients", coef_mode="fixed", rank_every=0)
    actor, critic = reg.penalty(ctx)
    torch.testing.assert_close(actor.loss, reg.network_loss(out_a, ctx.roles["actor"].reference))
    torch.testing.assert_close(critic.loss, reg.network_loss(out_c, ctx.roles["critic"].reference))
    assert float(actor.loss.detach()) > 0 and float(critic.loss.detach()) > 0


def test_an_adaptive_role_without_a_ratio_yet_is_refreshed_off_cycle() -> None:
    torch.manual_seed(25)
    policy = _policy()
    out = policy.actor_net(torch.randn(16, 5))
    reg = Sphere(ratio_every=3, rank_every=0)
    reg.load_state_dict({"calls": 1, "ratios": {}}, policy)  # resumed before any ratio was resolved
    (term,) = reg.penalty(_ctx(policy, out, {"actor": (out.out**2).mean()}))
    assert term.scale is not None  # refreshed at call 1, not a missing ratio


def test_the_gradient_gram_takes_the_last_layer_of_a_deeper_net_and_logs_no_feature_trace() -> None:
    torch.manual_seed(26)
    net = _net("topk", hidden=(8, 6, 5), n_experts=3).double()  # pre[1] is not the last layer here
    out = net(torch.randn(7, 6, dtype=torch.float64))
    per_sample = (out.out**2).sum(1) + out.out[:, 0]
    reg = Sphere(gram="gradients", rank_every=1)
    value = reg.network_loss(out, per_sample.mean())
    torch.testing.assert_close(value, _brute_gradient_gram(out, per_sample, out.groups[0].expert.pre[-1]))
    assert reg.logs() == {}  # the trace and rank logged are the features', not the gradients'
    both = Sphere(gram="both", rank_every=1)
    both.network_loss(out, per_sample.mean())
    assert both.logs()["sphere_trace"] == pytest.approx(float(_last_gram(out).trace()))


def test_sphere_honours_alpha_scale_invariance_and_the_gram_space_on_the_joint_gram() -> None:
    torch.manual_seed(27)
    net = _net("topk").double()
    out = net(torch.randn(30, 6, dtype=torch.float64))
    phi = out.phi()
    torch.testing.assert_close(Sphere(alpha=0.3).network_loss(out), brute(phi, alpha=0.3))
    a = phi.t() @ phi / phi.shape[0]
    torch.testing.assert_close(Sphere(scale_invariant=True).network_loss(out), brute(phi) / a.trace() ** 2)
    policy = _policy()  # m = 4 experts x 16 = 64 features
    out = policy.actor_net(torch.randn(24, 5))
    for space, size in (("auto", 24), ("sample", 24), ("feature", 64)):
        reg = Sphere(space=space)
        reg.penalty(_ctx_sync_free(policy, out))
        assert tuple(reg._last_gram.shape) == (size, size)
