"""Baselines: each one's defining property, on rl_moe policies (MoE and dense)."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rl_moe.policies import MoEActorCriticPolicy, Role
from rl_moe.regularizers import (
    REGISTRY,
    CChain,
    ContinualBackprop,
    LoadBalance,
    LossContext,
    Orthogonality,
    Parseval,
    ReDo,
    SpectralReg,
    loss_context,
    make_regularizer,
)
from rl_moe.regularizers.ortho import orthogonality_loss
from rl_moe.regularizers.parseval import parseval_loss
from rl_moe.regularizers.redo import dormant_units
from rl_moe.regularizers.targets import role_hidden_weights
from rl_moe.regularizers.units import UnitStats


def _policy(kind: str = "topk", **kw) -> MoEActorCriticPolicy:
    obs, act = spaces.Box(-1, 1, (5,), np.float32), spaces.Box(-1, 1, (2,), np.float32)
    arch = dict(n_experts=3, top_k=2, hidden=(8, 8), gate_hidden=(8,))
    arch.update(kw)
    return MoEActorCriticPolicy(obs, act, lambda _: 1e-2, moe=kind, **arch)


def _algo(policy):
    return types.SimpleNamespace(policy=policy)


def _ctx(algo, out, losses) -> LossContext:
    """A PPO minibatch context whose actor output is ``out`` (no critic output)."""
    zero = out.out.new_zeros(())
    refs = {"actor": losses.get("actor", zero), "critic": zero}
    return loss_context(algo, "ppo", None, {"actor": (out,)}, refs, losses)


def _step(reg, algo, x: torch.Tensor, losses=None):
    out = algo.policy.actor_net(x)
    losses = losses or {"actor": out.out.pow(2).mean(), "policy": out.out.pow(2).mean()}
    ctx = _ctx(algo, out, losses)
    reg.observe(ctx)
    return out, reg.penalty(ctx)


def test_registry_and_errors() -> None:
    assert set(REGISTRY) == {"sphere", "parseval", "cbp", "redo", "cchain", "specreg", "load_balance", "ortho", "sdmoe", "dsc", "snp", "l2init", "nap", "injection", "reset"}
    assert isinstance(make_regularizer("parseval", coef=2e-3), Parseval)
    with pytest.raises(ValueError, match="valid choices: sphere, parseval"):
        make_regularizer("l2")
    with pytest.raises(ValueError, match="valid choices"):
        make_regularizer("redo", tau=0.1, every=3)
    with pytest.raises(ValueError, match="valid choices: actor, critic, both"):
        make_regularizer("parseval", target="gate")


def test_registry_public_names_all_resolve_and_every_method_is_exported() -> None:
    import rl_moe.regularizers as regs

    missing = [name for name in regs.__all__ if not hasattr(regs, name)]
    assert missing == [] and len(set(regs.__all__)) == len(regs.__all__)
    assert {cls.__name__ for cls in REGISTRY.values()} <= set(regs.__all__)
    assert all(REGISTRY[name].name == name for name in REGISTRY)  # the key is the log tag's name
    with pytest.raises(ValueError) as err:
        make_regularizer("l2")
    assert str(err.value) == f"unknown regularizer 'l2'; valid choices: {', '.join(REGISTRY)}"


def test_parseval_known_answer_and_steps_reduce_it() -> None:
    torch.manual_seed(0)
    q = torch.linalg.qr(torch.randn(6, 6)).Q
    assert float(parseval_loss((2**0.5 * q)[None], 2.0)) == pytest.approx(0.0, abs=1e-4)
    for shape in ((1, 4, 7), (2, 7, 4)):  # both Gram sides
        w = torch.randn(*shape)
        for s in (2.0, 0.5):  # s = 2 alone cannot tell s² from 2s
            brute = sum((we @ we.t() - s * torch.eye(shape[1])).pow(2).sum() for we in w)
            torch.testing.assert_close(parseval_loss(w, s), brute, rtol=1e-4, atol=1e-4)
    policy = _policy()
    with torch.no_grad():  # move away from the orthogonal init, which is already near the optimum
        for w in policy.actor_net.experts.weights:
            w.mul_(1.5 + torch.rand_like(w))
    algo, reg = _algo(policy), Parseval(coef=1.0)
    refs = role_hidden_weights(policy.roles()["actor"])
    assert [r.stacked for r in refs] == [True, True, False]  # two expert hidden layers, the gate body layer
    opt = torch.optim.Adam(policy.actor_net.parameters(), lr=1e-2)
    before = None
    for _ in range(20):
        (term,) = _step(reg, algo, torch.randn(16, 5))[1]
        before = float(term.loss.detach()) if before is None else before
        opt.zero_grad()
        term.loss.backward()
        opt.step()
    assert float(_step(reg, algo, torch.randn(16, 5))[1][0].loss.detach()) < 0.9 * before


def test_parseval_scale_is_the_activations_gain_squared_unless_given_and_terms_are_named_by_role() -> None:
    """s = gain² of the network's activation (2 for ReLU, (5/3)² for tanh) or the one given; with
    both roles, one term per role named by it, each with the configured λ."""
    x = torch.randn(16, 5)

    def terms(policy, **cfg):  # type: ignore[no-untyped-def]
        algo = _algo(policy)
        out = policy.actor_net(x)
        ctx = loss_context(algo, "ppo", None, {"actor": (out,)}, {"actor": out.out.sum(), "critic": out.out.sum()}, {})
        return Parseval(**cfg).penalty(ctx)

    def expected(policy, role: str, scale: float) -> float:  # type: ignore[no-untyped-def]
        with torch.no_grad():
            return float(sum(parseval_loss(r.rows_out(), scale) for r in role_hidden_weights(policy.roles()[role])))

    relu, tanh = _policy(), _policy(activation="tanh")
    (term,) = terms(relu, coef=0.25)
    assert term.name == "parseval" and term.coef == 0.25
    assert float(term.loss.detach()) == pytest.approx(expected(relu, "actor", 2.0), rel=1e-6)
    (term,) = terms(tanh)
    assert float(term.loss.detach()) == pytest.approx(expected(tanh, "actor", (5 / 3) ** 2), rel=1e-6)
    (term,) = terms(tanh, scale=0.5)
    assert float(term.loss.detach()) == pytest.approx(expected(tanh, "actor", 0.5), rel=1e-6)
    from rl_moe.regularizers.parseval import _activation_scale

    plain = Role("actor", (torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)),), None)
    assert _activation_scale(plain) == 2.0  # a plain network's s is ReLU's, the paper code's default
    both = terms(relu, target="both", coef=0.5)
    assert [(t.name, t.coef) for t in both] == [("parseval_actor", 0.5), ("parseval_critic", 0.5)]
    assert float(both[1].loss.detach()) == pytest.approx(expected(relu, "critic", 2.0), rel=1e-6)


def _kill_units(policy, expert: int, units: list[int]) -> None:
    with torch.no_grad():
        stack = policy.actor_net.experts
        stack.weights[0][expert][:, units] = 0.0
        stack.biases[0][expert][units] = -1.0  # ReLU(-1) = 0: dormant, zero utility


def test_cbp_replaces_expected_number_of_low_utility_units() -> None:
    policy = _policy(kind="dense_moe", hidden=(8,))  # every expert sees every row; one hidden layer
    _kill_units(policy, 0, [1, 5])
    algo = _algo(policy)
    reg = ContinualBackprop(replacement_rate=1 / 16, maturity=0, gate=False)
    stack = policy.actor_net.experts
    x = torch.randn(32, 5)
    next_linear_mean = stack.weights[1].detach().clone()
    for step in range(1, 11):
        out, _ = _step(reg, algo, x)
        before_z1 = out.groups[0].expert.linear[1].detach().view(3, 32, 2).mean(1)  # (E, D) head outputs
        reg.after_update(algo, "ppo")
        if step == 2:  # budget 8 * 1/16 * 2 = 1 unit per expert layer: expert 0 loses a dead unit
            rows_zero = (stack.weights[1][0].abs().sum(1) == 0).nonzero().flatten().tolist()
            assert len(rows_zero) == 1 and rows_zero[0] in (1, 5)
            assert stack.weights[0][0][:, rows_zero[0]].abs().sum() > 0  # fresh input weights
            # The mean activation is folded into the next bias: mean next pre-activation is kept.
            after = policy.actor_net(x).groups[0].expert.linear[1].detach().view(3, 32, 2).mean(1)
            torch.testing.assert_close(after, before_z1, rtol=1e-5, atol=1e-6)
    # 8 units x 1/16 per step x 10 steps = 5 replacements per expert layer, 3 experts.
    assert reg.n_replaced == 15
    assert not torch.equal(next_linear_mean, stack.weights[1].detach())


def test_redo_resets_exactly_dormant_units_and_their_adam_state() -> None:
    torch.manual_seed(0)
    policy = _policy(kind="dense_moe")
    _kill_units(policy, 1, [0, 3, 4])
    algo = _algo(policy)
    stack = policy.actor_net.experts
    x = torch.randn(40, 5)
    # Populate Adam moments, then check ReDo zeroes those of the reset entries only.
    policy.optimizer.zero_grad()
    policy.actor_net(x).out.sum().backward()
    policy.optimizer.step()
    out = policy.actor_net(x)
    h = out.groups[0].expert.hidden  # rows expert-major, 40 per expert
    expected = []
    for layer in range(2):
        mean_abs = h[layer].detach().abs().view(3, 40, 8).mean(1)  # (E, H)
        expected.append(mean_abs / mean_abs.mean(1, keepdim=True) <= 0.025)
    assert expected[0][1, [0, 3, 4]].all()
    w_out = [stack.weights[l + 1].detach().clone() for l in range(2)]
    reg = ReDo(frequency=1, gate=False)
    reg.observe(_ctx(algo, out, {}))
    reg.after_update(algo, "ppo")
    for layer in range(2):
        zero_rows = stack.weights[layer + 1].detach().abs().sum(2) == 0  # (E, H)
        torch.testing.assert_close(zero_rows, expected[layer] | (w_out[layer].abs().sum(2) == 0))
        kept = ~expected[layer]
        torch.testing.assert_close(stack.weights[layer + 1].detach()[kept], w_out[layer][kept])
    assert reg.n_reset == int(sum(e.sum() for e in expected))
    state = policy.optimizer.state[stack.weights[1]]
    assert state["exp_avg"][1, [0, 3, 4], :].abs().sum() == 0
    assert state["exp_avg"][0].abs().sum() > 0


def test_redo_skips_idle_experts_but_recycles_a_silent_layer() -> None:
    mean_abs = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.01, 1.0, 2.0]])  # (E, H)
    stats = UnitStats(mean_abs, mean_abs, torch.tensor([0.0, 5.0, 5.0]))  # expert 0 got no rows
    expected = torch.tensor([[False] * 3, [True] * 3, [True, False, False]])
    torch.testing.assert_close(dormant_units(stats, 0.025), expected)


def test_redo_threshold_is_inclusive_and_one_routed_row_counts() -> None:
    from rl_moe.maths import dormant_scores

    mean_abs = torch.tensor([[0.25, 1.75, 1.0], [0.25, 1.75, 1.0]])  # scores 0.25, 1.75, 1.0 exactly
    assert float(dormant_scores(mean_abs)[0, 0]) == 0.25
    stats = UnitStats(mean_abs, mean_abs, torch.tensor([1.0, 0.0]))  # expert 0 got one row, expert 1 none
    torch.testing.assert_close(dormant_units(stats, 0.25), torch.tensor([[True, False, False], [False] * 3]))


def test_redo_checks_every_frequency_steps_on_that_steps_minibatch_and_counts_every_unit() -> None:
    """frequency = 3: the check after the third gradient step uses the third minibatch's
    activations (units killed only before it are reset), the counts add up over experts and over
    checks, steps count from zero per role, a due step with nothing observed resets nothing, and
    the reset entries' Adam moments are zeroed."""
    torch.manual_seed(0)
    policy = _policy(kind="dense_moe")
    algo, stack = _algo(policy), policy.actor_net.experts
    x = torch.randn(40, 5)
    reg = ReDo(frequency=3, gate=False)

    def step() -> None:
        out = policy.actor_net(x)
        reg.observe(_ctx(algo, out, {}))
        policy.optimizer.zero_grad()
        out.out.sum().backward()
        policy.optimizer.step()
        reg.after_update(algo, "ppo")

    step()
    step()
    assert reg.n_reset == 0 and reg.state_dict(policy)["steps"] == {"actor": 2}
    assert float(policy.optimizer.state[stack.weights[0]]["exp_avg"][1][:, [0, 3]].abs().sum()) > 0
    _kill_units(policy, 1, [0, 3])
    _kill_units(policy, 2, [5])
    step()  # the check: units 0 and 3 of expert 1 and unit 5 of expert 2 are dormant in the first layer
    first = reg.n_reset
    assert first >= 3 and reg.state_dict(policy)["steps"] == {"actor": 3}
    assert float(policy.optimizer.state[stack.weights[0]]["exp_avg"][1][:, [0, 3]].abs().sum()) == 0
    assert reg.logs() == {"redo_units_reset": float(first)}
    for _ in range(2):
        step()
    _kill_units(policy, 1, [0, 3])
    _kill_units(policy, 2, [5])
    step()
    assert reg.n_reset == 2 * first  # the same units again, added to the first check's
    idle = ReDo(frequency=1, gate=False)
    idle.after_update(algo, "ppo")  # due, but no minibatch was observed
    assert idle.n_reset == 0


def test_unit_statistics_per_expert_and_of_the_gate_against_brute_force() -> None:
    """layer_stats: per expert, mean |h| and mean h over its routed rows (one row: that row's
    values), rows in the features' dtype, 0 for an idle expert; gate_stats: one group over all
    N states, (1, G) means and rows = [N]."""
    from rl_moe.regularizers.units import gate_stats, layer_stats

    torch.manual_seed(3)
    policy = _policy()
    for n in (1, 16):  # top-2 of 3 experts: one state gives two experts a single row each
        out = policy.actor_net(torch.randn(n, 5))
        group = out.groups[0]
        idx = group.dispatch.expert_idx
        for layer in range(2):
            stats = layer_stats(group.dispatch, group.expert, layer)
            h = group.expert.hidden[layer].detach()
            assert stats.rows.dtype == h.dtype and stats.rows.tolist() == [float(c) for c in group.dispatch.counts]
            for e in range(3):
                rows = h[idx == e]
                want_abs = rows.abs().mean(0) if len(rows) else torch.zeros(h.shape[1])
                want = rows.mean(0) if len(rows) else torch.zeros(h.shape[1])
                torch.testing.assert_close(stats.mean_abs[e], want_abs)
                torch.testing.assert_close(stats.mean[e], want)
    emb = torch.tensor([[1.0, -2.0, 0.0], [3.0, 2.0, 0.0], [-1.0, 0.0, 0.0], [1.0, 4.0, 0.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    g = gate_stats(emb)
    assert g.rows.tolist() == [5.0] and g.rows.dtype == torch.float64
    assert g.mean_abs.shape == g.mean.shape == (1, 3)
    torch.testing.assert_close(g.mean_abs, torch.tensor([[1.4, 1.8, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(g.mean, torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64))


def test_unit_statistics_and_fresh_weights_stay_on_the_features_device() -> None:
    """``meta`` stands for an accelerator: nothing is made on the CPU behind the network's back."""
    from rl_moe.nn import Dispatch
    from rl_moe.nn.experts import ExpertPass
    from rl_moe.regularizers.units import fresh_input_weights, gate_stats, layer_stats

    h = torch.empty(5, 4, device="meta")
    idx = torch.zeros(5, dtype=torch.long, device="meta")
    dispatch = Dispatch(sample_idx=idx, expert_idx=idx, weight=torch.empty(5, device="meta"), counts=(3, 2), n_samples=5)
    stats = layer_stats(dispatch, ExpertPass(h, (h,), (h,), (h,), (h,), ()), 0)
    assert {t.device.type for t in stats} == {"meta"}
    assert {t.device.type for t in gate_stats(h)} == {"meta"}
    stack = _policy().actor_net.experts.to("meta")
    assert fresh_input_weights(stack, 1).device.type == "meta"


def test_unit_resets_draw_like_the_init_and_reach_every_optimizer_and_the_gates_layernorm() -> None:
    from rl_moe.regularizers.units import ExpertUnits, GateUnits, fresh_input_weights, reset_moments, unit_layers

    policy = _policy()
    stack = policy.actor_net.experts
    fresh = fresh_input_weights(stack, 1)  # an 8 -> 8 layer: orthogonal times ReLU's gain
    torch.testing.assert_close(torch.linalg.svdvals(fresh), torch.full((8,), 2**0.5))
    tanh = _policy(activation="tanh").actor_net.experts
    torch.testing.assert_close(torch.linalg.svdvals(fresh_input_weights(tanh, 1)), torch.full((8,), 5 / 3))
    with torch.no_grad():
        stack.weights[1].data = stack.weights[1].data.double()
    assert fresh_input_weights(stack, 1).dtype == torch.float64

    p = torch.nn.Parameter(torch.ones(4))
    idle, used = torch.optim.Adam([p]), torch.optim.Adam([p])
    p.grad = torch.ones(4)
    used.step()
    reset_moments([idle, used], p, (slice(1, 3),))  # an optimizer without state for p comes first
    assert used.state[p]["exp_avg"].tolist()[1:3] == [0.0, 0.0] and used.state[p]["exp_avg"][0] != 0

    ln = _policy(layer_norm=True)
    body = ln.actor_net.gate.body
    units = GateUnits(ln.actor_net.gate)
    linear, norm, activation = units._layers()
    assert linear is body[0] and norm is body[1] and activation == body[-1].name
    with torch.no_grad():
        norm.weight.fill_(3.0)
        norm.bias.fill_(2.0)
    units.reinit(0, torch.tensor([2]), [])
    assert (norm.weight.detach()[[2, 1]].tolist(), float(norm.bias.detach()[2])) == ([1.0, 3.0], 0.0)

    linear_gate = _policy(gate_hidden=())
    out = linear_gate.actor_net(torch.randn(4, 5))
    layers = unit_layers(linear_gate.actor_net, out, gate=True)  # a gate without hidden layers has no units to reset
    assert layers and all(isinstance(u, ExpertUnits) for u, _ in layers)


def _gate_layers(policy):
    gate = policy.actor_net.gate
    return gate.body[0], gate.logits  # gate_hidden=(8,): Linear(5, 8), then the activation


def test_redo_resets_dormant_gate_units_and_keeps_the_routing() -> None:
    policy = _policy()
    body, logits = _gate_layers(policy)
    with torch.no_grad():
        body.weight[[2, 6]] = 0.0
        body.bias[[2, 6]] = -1.0  # ReLU(-1) = 0 on every state: dormant
    algo = _algo(policy)
    x = torch.randn(40, 5)
    policy.optimizer.zero_grad()
    policy.actor_net(x).out.sum().backward()
    policy.optimizer.step()
    out = policy.actor_net(x)
    emb = out.gate_embedding.detach().abs().mean(0)
    dormant = (emb / emb.mean() <= 0.025).nonzero().flatten().tolist()
    assert 2 in dormant and 6 in dormant
    keep = [i for i in range(8) if i not in dormant]
    w_logits = logits.weight.detach().clone()
    reg = ReDo(frequency=1)
    reg.observe(_ctx(algo, out, {}))
    reg.after_update(algo, "ppo")
    assert logits.weight[:, dormant].abs().sum() == 0 and torch.equal(logits.weight[:, keep], w_logits[:, keep])
    assert body.weight[dormant].abs().sum(1).min() > 0 and body.bias[dormant].abs().sum() == 0  # fresh inputs
    assert policy.optimizer.state[logits.weight]["exp_avg"][:, dormant].abs().sum() == 0
    # Zero outgoing weights: the logits, hence the routing and the output, are unchanged.
    torch.testing.assert_close(policy.actor_net(x).logits, out.logits)


def test_cbp_layer_state_lives_on_the_weights_device_with_its_shapes_and_dtypes() -> None:
    """Utility, mean and age are (E, H), age counts in integers and the fractional budget (E,)
    in float64 (rate 1e-4 added each step would round away in float32), all on the weights'
    device (``meta`` here stands for an accelerator)."""
    from rl_moe.regularizers.cbp import _LayerState

    for device in ("cpu", "meta"):
        units = types.SimpleNamespace(shape=(2, 3), out_weights=lambda device=device: torch.empty(2, 3, 4, device=device))
        st = _LayerState(units)
        assert [(f, tuple(getattr(st, f).shape), getattr(st, f).dtype, getattr(st, f).device.type) for f in _LayerState.FIELDS] == [
            ("util", (2, 3), torch.float32, device), ("mean", (2, 3), torch.float32, device),
            ("age", (2, 3), torch.long, device), ("budget", (2,), torch.float64, device),
        ]  # fmt: skip


def test_cbp_loads_its_state_onto_the_policys_device() -> None:
    """A checkpoint's running averages follow the policy (``meta`` standing for an accelerator)."""
    policy = _policy()
    out = policy.actor_net(torch.randn(8, 5))
    reg = ContinualBackprop()
    reg.observe(_ctx(_algo(policy), out, {}))
    state = reg.state_dict(policy)
    policy.to("meta")
    moved = ContinualBackprop()
    moved.load_state_dict(state, policy)
    assert moved._states and all(getattr(st, f).device.type == "meta" for st in moved._states.values() for f in st.FIELDS)


def test_cbp_running_averages_update_only_experts_with_rows() -> None:
    """One step from zero: util = (1 − η) · mean|h| · mean_k |w_out| and mean = (1 − η) · mean h for
    an expert with one routed row; an expert with none keeps its averages; every unit ages; an
    update with nothing observed replaces nothing; the log names the count."""
    from rl_moe.regularizers.cbp import _LayerState

    w_out = torch.tensor([[[1.0, -3.0], [2.0, 2.0]], [[4.0, 0.0], [0.0, 0.0]]])  # (E=2, H=2, out=2)
    units = types.SimpleNamespace(shape=(2, 2), out_weights=lambda: w_out)
    reg = ContinualBackprop(decay=0.9)
    st = _LayerState(units)
    st.util[1], st.mean[1] = 5.0, -1.0
    mean_abs = torch.tensor([[2.0, 1.0], [3.0, 3.0]])
    reg.update_utility(st, mean_abs, -mean_abs, torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(st.util, torch.tensor([[0.1 * 2.0 * 2.0, 0.1 * 1.0 * 2.0], [5.0, 5.0]]))
    torch.testing.assert_close(st.mean, torch.tensor([[-0.2, -0.1], [-1.0, -1.0]]))
    assert st.age.tolist() == [[1, 1], [1, 1]]
    reg.after_update(_algo(_policy()), "ppo")  # nothing observed this step
    assert reg.n_replaced == 0 and reg.logs() == {"cbp_units_replaced": 0.0}


def test_cbp_replaces_gate_units_and_folds_their_mean_into_the_logit_bias() -> None:
    policy = _policy()
    body, logits = _gate_layers(policy)
    with torch.no_grad():
        body.weight[3] = 0.0
        body.bias[3] = 0.5  # constant activation 0.5: its mean is exactly 0.5
        logits.weight[:, 3] *= 1e-4  # lowest utility of the layer
    algo = _algo(policy)
    x = torch.randn(32, 5)
    reg = ContinualBackprop(replacement_rate=1 / 8, maturity=0)  # budget 8 * 1/8 = 1 gate unit per step
    out, _ = _step(reg, algo, x)
    reg.after_update(algo, "ppo")
    assert logits.weight[:, 3].abs().sum() == 0 and body.bias[3] == 0  # unit 3, and only it, replaced
    assert (logits.weight.abs().sum(0) == 0).sum() == 1
    # 0.5 * w_out was folded into the bias and unit 3 now contributes nothing: the same logits.
    torch.testing.assert_close(policy.actor_net(x).logits, out.logits.detach(), rtol=1e-5, atol=1e-6)


def test_spectral_reg_matches_exact_sigma() -> None:
    policy = _policy(kind="mlp")
    algo, reg = _algo(policy), SpectralReg(coef=1e-4)
    for _ in range(30):
        (term,) = _step(reg, algo, torch.randn(8, 5))[1]
    exact = sum(
        (torch.linalg.matrix_norm(r.rows_out().detach(), ord=2).pow(2) - 1).pow(2).sum()
        for r in role_hidden_weights(policy.roles()["actor"])
    )
    assert term.loss.item() == pytest.approx(float(exact), rel=1e-3)
    assert term.coef == 1e-4


def test_specreg_loss_known_answer_power_schedule_and_private_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """(σ² − 1)² at σ = 2 is 9 (the orthogonal init's σ = √2 gives 1 for any power); ten power
    rounds on a weight's first call, one after; the start vector comes from a private generator
    (the global RNG, which draws the run's actions, is untouched) as unit rows of the weight's dtype."""
    from rl_moe.regularizers import specreg

    w = torch.diag(torch.tensor([2.0, 1.0], dtype=torch.float64))[None]  # (1, 2, 2), σ_max = 2
    it = specreg.PowerIteration(w)
    start = it.state()
    assert start["u"].dtype == start["v"].dtype == torch.float64 and start["steps"] == 10
    assert start["u"].shape == (1, 2) and not start["u"].any()
    assert start["v"].shape == (1, 2) and float(start["v"].norm()) == pytest.approx(1.0)
    wide = specreg.PowerIteration(torch.randn(3, 4, 6)).state()  # (E, out, in): u (E, out), v (E, in), each row unit
    assert wide["u"].shape == (3, 4) and wide["v"].shape == (3, 6)
    torch.testing.assert_close(wide["v"].norm(dim=1), torch.ones(3))
    assert float(specreg.spectral_loss(w, it)) == pytest.approx(9.0, rel=1e-9)
    back = specreg.PowerIteration.restore({k: v.float() if torch.is_tensor(v) else v for k, v in it.state().items()}, w)
    assert back.u.dtype == back.v.dtype == torch.float64 and back.steps == 1

    rounds: list[int] = []
    real = specreg.power_iteration
    monkeypatch.setattr(specreg, "power_iteration", lambda w, pair, steps: rounds.append(steps) or real(w, pair, steps))
    policy = _policy(kind="mlp")
    algo, reg = _algo(policy), SpectralReg(specreg.SpecRegConfig(coef=0.5))
    assert reg.config.coef == 0.5  # the config given
    x = torch.randn(8, 5)
    rng = torch.get_rng_state()
    (term,) = _step(reg, algo, x)[1]
    assert torch.equal(torch.get_rng_state(), rng)
    layers = len(role_hidden_weights(policy.roles()["actor"]))
    assert rounds == [10] * layers and (term.name, term.coef) == ("specreg", 0.5)
    _step(reg, algo, x)
    assert rounds == [10] * layers + [1] * layers


def test_specreg_terms_are_named_by_role_and_load_onto_the_policys_dtype() -> None:
    policy = _policy(kind="mlp")
    algo = _algo(policy)
    out = policy.actor_net(torch.randn(8, 5))
    ctx = loss_context(algo, "ppo", None, {"actor": (out,)}, {"actor": out.out.sum(), "critic": out.out.sum()}, {})
    both = SpectralReg(target="both").penalty(ctx)
    assert [t.name for t in both] == ["specreg_actor", "specreg_critic"]
    reg = SpectralReg()
    reg.penalty(ctx)
    state = reg.state_dict(policy)
    policy.double()
    loaded = SpectralReg()
    loaded.load_state_dict(state, policy)
    assert loaded._iters and all(it.u.dtype == it.v.dtype == torch.float64 for it in loaded._iters.values())


def test_cchain_coefficient_warmup_and_ratio() -> None:
    """c = initial_coef until ``warmup`` updates are recorded (or while the churn term has been 0),
    then target_ratio · mean |L_pg| / mean L_reg over the window."""
    reg = CChain(warmup=3, window=10, target_ratio=0.5, initial_coef=7.0)
    for pg, churn in ((-2.0, 0.125), (4.0, 0.375)):
        reg._pg["actor"].append(pg)
        reg._reg["actor"].append(churn)
    assert reg.coefficient("actor") == 7.0  # 2 of 3 warm-up updates
    reg._pg["actor"].append(0.0)
    reg._reg["actor"].append(0.25)
    assert reg.coefficient("actor") == pytest.approx(0.5 * 2.0 / 0.25)  # mean |pg| 2, mean churn 0.25 (sum 0.75 <= 1)
    idle = CChain(warmup=1)
    idle._pg["actor"].append(1.0)
    idle._reg["actor"].append(0.0)
    assert idle.coefficient("actor") == idle.config.initial_coef  # no churn yet: no division by zero
    idle.after_update(_algo(_policy()), "ppo")  # nothing held: nothing to commit


def test_cchain_reads_the_policy_loss_for_ppos_actor_and_the_reference_for_the_critic() -> None:
    policy = _policy()
    algo, reg = _algo(policy), CChain(target="both")
    reg.on_training_start(algo)
    x = torch.randn(8, 5)

    def penalty():  # type: ignore[no-untyped-def]
        outs = {"actor": (policy.actor_net(x),), "critic": (policy.critic_net(x),)}
        return reg.penalty(loss_context(algo, "ppo", None, outs, {"actor": torch.tensor(5.0), "critic": torch.tensor(7.0)}, {"policy": torch.tensor(3.0)}))

    assert [t.name for t in penalty()] == ["cchain_actor", "cchain_critic"]
    reg.after_update(algo, "ppo")  # the snapshots are the networks as they are now
    penalty()
    assert (reg._pg["actor"][-1], reg._pg["critic"][-1]) == (3.0, 7.0)
    assert not any(p.requires_grad for snap in reg._snaps.values() for p in snap.copy.parameters())
    only_critic = CChain(target="both")
    outs = {"critic": (policy.critic_net(x),)}  # the actor returned nothing this minibatch
    (term,) = only_critic.penalty(loss_context(algo, "ppo", None, outs, {"actor": torch.tensor(5.0), "critic": torch.tensor(7.0)}, {"policy": torch.tensor(3.0)}))
    assert term.name == "cchain_critic"


def test_cchain_is_zero_before_first_update_then_tracks_previous_network() -> None:
    policy = _policy()
    algo, reg = _algo(policy), CChain()
    reg.on_training_start(algo)
    x = torch.randn(16, 5)
    out, (term,) = _step(reg, algo, x)
    assert term.loss.item() == 0.0 and term.coef == 100.0
    prev = [p.detach().clone() for p in policy.actor_net.parameters()]
    policy.optimizer.zero_grad()
    out.out.sum().backward()
    policy.optimizer.step()
    reg.after_update(algo, "ppo")
    out, (term,) = _step(reg, algo, x)
    with torch.no_grad():
        now = [p.detach().clone() for p in policy.actor_net.parameters()]
        for p, q in zip(policy.actor_net.parameters(), prev):
            p.copy_(q)
        old = policy.actor_net(x).out
        for p, q in zip(policy.actor_net.parameters(), now):
            p.copy_(q)
    torch.testing.assert_close(term.loss, torch.nn.functional.mse_loss(out.out, old))
    assert term.loss.item() > 0


def test_cchain_coefficient_after_warmup() -> None:
    reg = CChain(warmup=3, window=4)
    for pg, lr in [(-1.0, 0.5), (2.0, 0.5), (-3.0, 1.0), (4.0, 2.0), (1.0, 1.0)]:
        reg._pg["actor"].append(pg)
        reg._reg["actor"].append(lr)
    # Last 4: mean|pg| = 2.5, mean reg = 1.125.
    assert reg.coefficient("actor") == pytest.approx(0.05 * 2.5 / 1.125)


def test_load_balance_is_one_for_uniform_routing() -> None:
    policy = _policy(kind="dense_moe")
    with torch.no_grad():
        policy.actor_net.gate.logits.weight.zero_()
        policy.actor_net.gate.logits.bias.zero_()
    algo = _algo(policy)
    _, (term,) = _step(LoadBalance(), algo, torch.randn(16, 5))
    assert term.loss.item() == pytest.approx(1.0) and term.coef == 0.01 and term.name == "load_balance"
    _, (term,) = _step(LoadBalance(target="both", coef=0.3), algo, torch.randn(16, 5))  # the dense critic adds nothing
    assert (term.name, term.coef) == ("load_balance_actor", 0.3)
    torch.manual_seed(6)
    skewed = _policy()
    with torch.no_grad():
        skewed.actor_net.gate.logits.bias.copy_(torch.tensor([5.0, 4.0, -5.0]))
    out, (term,) = _step(LoadBalance(), _algo(skewed), torch.randn(64, 5))
    # Independent: f_e from the selected indices, P_e from the softmax of the logits.
    f = torch.bincount(out.indices.flatten(), minlength=3).float() / out.indices.numel()
    p = torch.softmax(out.logits, 1).mean(0)
    assert term.loss.item() == pytest.approx((3 * (f * p).sum()).item(), rel=1e-5)
    assert term.loss.item() > 1.0
    assert _step(LoadBalance(), _algo(_policy(kind="mlp")), torch.randn(4, 5))[1] == []


def test_orthogonality_known_answers() -> None:
    w = torch.randn(1, 4, 3)
    assert float(orthogonality_loss(torch.cat([w, 2 * w]))) == pytest.approx(1.0)
    eye = torch.eye(3).view(3, 3, 1)
    assert float(orthogonality_loss(eye)) == 0.0
    r = torch.randn(4, 6)
    u = r / r.norm(dim=1, keepdim=True)
    brute = sum(float(u[i] @ u[j]) ** 2 for i in range(4) for j in range(i + 1, 4))
    assert float(orthogonality_loss(r)) == pytest.approx(brute, rel=1e-5)
    policy = _policy()
    _, (term,) = _step(Orthogonality(), _algo(policy), torch.randn(4, 5))
    torch.testing.assert_close(term.loss, orthogonality_loss(policy.actor_net.experts.weights[0]))
    assert _step(Orthogonality(), _algo(_policy(kind="mlp")), torch.randn(4, 5))[1] == []


def test_orthogonality_is_scale_free_counts_two_experts_and_reaches_a_moe_critic() -> None:
    r = torch.randn(4, 6)
    assert float(orthogonality_loss(1e-3 * r)) == pytest.approx(float(orthogonality_loss(r)), rel=1e-5)  # small norms too
    two = _policy(n_experts=2)
    _, (term,) = _step(Orthogonality(coef=0.2), _algo(two), torch.randn(4, 5))
    assert term.coef == 0.2 and float(term.loss.detach()) == pytest.approx(float(orthogonality_loss(two.actor_net.experts.weights[0].detach())))
    obs, act = spaces.Box(-1, 1, (5,), np.float32), spaces.Box(-1, 1, (2,), np.float32)
    critic_moe = MoEActorCriticPolicy(obs, act, lambda _: 1e-2, moe="topk", actor_moe=False, critic_moe=True, n_experts=3, top_k=2, hidden=(8, 8), gate_hidden=(8,))
    algo = _algo(critic_moe)
    x = torch.randn(4, 5)
    ctx = loss_context(algo, "ppo", None, {"actor": (critic_moe.actor_net(x),), "critic": (critic_moe.critic_net(x),)}, {"actor": x.sum(), "critic": x.sum()}, {})
    (term,) = Orthogonality(target="both").penalty(ctx)  # the dense actor has nothing to orthogonalize; the critic does
    assert term.name == "ortho_critic"


def test_dsc_aux_names_weights_and_sums_the_networks_four_losses() -> None:
    """Eq. 13's four terms, each with its own λ from the config, the budget from the branch
    signals and μ; a network without DSC outputs adds nothing."""
    from rl_moe.regularizers import DSCAux
    from rl_moe.regularizers.dsc import DSCConfig, budget_loss

    policy = _policy(kind="dsc")
    out = policy.actor_net(torch.randn(16, 5))
    cfg = DSCConfig(balance=0.1, budget=0.2, mu=5.0, frame=0.3, z=0.4)
    reg = DSCAux(cfg)
    assert reg.config == cfg
    terms = reg.penalty(_ctx(_algo(policy), out, {}))
    aux = out.aux.dsc
    expected = {"dsc_balance": (aux.balance, 0.1), "dsc_budget": (budget_loss(aux.signal, 5.0), 0.2), "dsc_frame": (aux.frame, 0.3), "dsc_z": (aux.z, 0.4)}
    assert [t.name for t in terms] == list(expected)
    for t in terms:
        loss, coef = expected[t.name]
        assert t.coef == coef
        torch.testing.assert_close(t.loss, loss)
    assert float(budget_loss(aux.signal, 5.0).detach()) > 0  # μ = 5 lies above the signal (about 3.5), so the budget term is live
    plain = _policy()
    assert DSCAux().penalty(_ctx(_algo(plain), plain.actor_net(torch.randn(4, 5)), {})) == []


def test_dsc_aux_reaches_a_dsc_critic_behind_a_plain_actor() -> None:
    from rl_moe.regularizers import DSCAux

    obs, act = spaces.Box(-1, 1, (5,), np.float32), spaces.Box(-1, 1, (2,), np.float32)
    policy = MoEActorCriticPolicy(obs, act, lambda _: 1e-2, moe="dsc", actor_moe=False, critic_moe=True, hidden=(8, 8))
    x = torch.randn(6, 5)
    outs = {"actor": (policy.actor_net(x),), "critic": (policy.critic_net(x),)}
    ctx = loss_context(_algo(policy), "ppo", None, outs, {"actor": x.sum(), "critic": x.sum()}, {})
    terms = DSCAux(target="both").penalty(ctx)
    assert [t.name for t in terms] == ["dsc_balance_critic", "dsc_budget_critic", "dsc_frame_critic", "dsc_z_critic"]
    both = MoEActorCriticPolicy(obs, act, lambda _: 1e-2, moe="dsc", actor_moe=True, critic_moe=True, hidden=(8, 8))
    outs = {"actor": (both.actor_net(x),), "critic": (both.critic_net(x),)}
    ctx = loss_context(_algo(both), "ppo", None, outs, {"actor": x.sum(), "critic": x.sum()}, {})
    assert len(DSCAux(target="both").penalty(ctx)) == 8  # four terms per role, the actor's kept


def test_sdmoe_refreshes_every_svd_every_steps_per_phase_and_keeps_its_counts() -> None:
    from rl_moe.nn.sdmoe import SpectralExperts
    from rl_moe.regularizers import SDRefresh

    policy = _policy(kind="sdmoe")
    algo = _algo(policy)
    stack = policy.actor_net.experts
    assert isinstance(stack, SpectralExperts)
    calls: list[int] = []
    real = stack.refresh_bases
    stack.refresh_bases = lambda: calls.append(1) or real()  # type: ignore[method-assign]
    from rl_moe.regularizers.sdmoe import SDMoEConfig

    reg = SDRefresh(SDMoEConfig(svd_every=3))  # the config given
    for _ in range(2):
        reg.after_update(algo, "ppo")
    assert calls == [] and reg.refreshes == 0
    reg.after_update(algo, "ppo")
    assert len(calls) == 1 and reg.refreshes == 1  # one SD-MoE stack (the critic is dense)
    for _ in range(3):
        reg.after_update(algo, "ppo")
    assert reg.refreshes == 2 and reg.logs() == {"sdmoe_refreshes": 2.0}
    state = reg.state_dict(policy)
    assert state == {"steps": {"ppo": 6}, "refreshes": 2}
    back = SDRefresh(svd_every=3)
    back.load_state_dict(state, policy)
    assert (back.steps, back.refreshes) == ({"ppo": 6}, 2)
    back.load_state_dict({}, policy)  # a state saved before these counts existed
    assert (back.steps, back.refreshes) == ({}, 0)


def test_hidden_weights_of_a_plain_sb3_policy_and_of_td3_targets() -> None:
    """A plain SB3 side is (its mlp_extractor branch, its output Linear): every Linear of the
    branch is hidden and the output layer is not; ``targets=True`` reads TD3's target copies."""
    from stable_baselines3 import TD3
    from stable_baselines3.common.policies import ActorCriticPolicy

    from rl_moe.policies import policy_roles
    from rl_moe.regularizers.targets import active_roles

    obs, act = spaces.Box(-1, 1, (5,), np.float32), spaces.Box(-1, 1, (2,), np.float32)
    plain = ActorCriticPolicy(obs, act, lambda _: 1e-3, net_arch=dict(pi=[16, 12], vf=[8]))
    refs = role_hidden_weights(policy_roles(plain)["actor"])
    branch = [m for m in plain.mlp_extractor.policy_net.modules() if isinstance(m, torch.nn.Linear)]
    assert [(r.module, r.name, r.stacked) for r in refs] == [(m, "weight", False) for m in branch]
    assert [tuple(r.tensor.shape) for r in refs] == [(16, 5), (12, 16)]
    td3 = TD3("MlpPolicy", "Pendulum-v1", policy_kwargs={"net_arch": [8, 8]}, device="cpu").policy
    actor = policy_roles(td3)["actor"]
    online, target = role_hidden_weights(actor), role_hidden_weights(actor, targets=True)
    assert len(online) == len(target) == 2
    assert all(a.tensor is not b.tensor and torch.equal(a.tensor, b.tensor) for a, b in zip(online, target))
    assert {id(r.tensor) for r in target} <= {id(p) for p in td3.actor_target.parameters()}
    assert active_roles("no-such-phase", ("actor", "critic")) == ()
    with pytest.raises(ValueError, match="unknown parseval option 'nosuch'"):
        Parseval(nosuch=1)


def test_term_names_carry_the_role_only_when_a_method_acts_on_both() -> None:
    from rl_moe.regularizers.targets import term_name

    assert term_name("parseval", ("actor",), "actor") == "parseval"
    assert term_name("parseval", ("critic",), "critic") == "parseval"
    assert term_name("dsc_z", ("actor", "critic"), "critic") == "dsc_z_critic"
