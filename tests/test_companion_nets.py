"""SD-MoE, DSC and SSMoE networks and losses against their papers' formulas (known answers and
brute-force references)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rl_moe.nn import EVRerouted, NetConfig, build_network
from rl_moe.nn.dsc import DSC_EPS, DSCBranch, dsc_balance_loss, dsc_layout, dsc_z_loss, frame_potential
from rl_moe.nn.sdmoe import SpectralExperts, shared_rank
from rl_moe.regularizers import Sphere
from rl_moe.regularizers.dsc import budget_loss

SMALL = dict(n_experts=4, top_k=2, hidden=(32, 24), gate_hidden=(16,))


# ---- SD-MoE ------------------------------------------------------------------------------------
def _sd_net(seed: int = 0, **kw) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_network(11, 3, NetConfig(kind="sdmoe", sd_rank_fraction=0.1, **{**SMALL, **kw}))


def test_shared_rank_is_one_percent_at_least_one() -> None:
    assert shared_rank(256, 256, 0.01) == 3 and shared_rank(39, 256, 0.01) == 1 and shared_rank(256, 4, 0.01) == 1
    assert shared_rank(256, 1, 0.01) == 0  # a critic head keeps a unique part
    assert shared_rank(1000, 800, 0.01) == 8


def test_sdmoe_init_unique_parts_in_orthogonal_complement() -> None:
    stack = _sd_net().experts
    assert isinstance(stack, SpectralExperts)
    for layer in range(stack.n_layers):
        a, b = stack.bases(layer)
        u, c = stack.unique[layer].detach(), stack.common[layer].detach()
        assert a.shape[1] == b.shape[1] == shared_rank(*c.shape, 0.1) >= 1
        assert (a.T @ u).abs().max() < 1e-6  # paper's W_u V_k = 0 (input side)
        assert (u @ b).abs().max() < 1e-6  # paper's U_k^T W_u = 0 (output side)
        assert torch.linalg.matrix_rank(c.double(), atol=1e-5).item() == a.shape[1]  # W_c = U_k S_k V_k^T (Eq. 6)
        # Eq. 6 + Alg. 1: the proxy matrix keeps the orthogonal draw's spectrum (sigma_head + sigma_tail).
        s = torch.linalg.svdvals((c + u[0]).double())
        torch.testing.assert_close(s, torch.full_like(s, s[0].item()), rtol=1e-5, atol=1e-6)
        assert not torch.allclose(u[0], u[1])  # each expert draws its own complement basis


def _proxy_gradients(net: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """dL/dW^(i) of the same network with the proxy matrices as plain parameters (brute force)."""
    dense = build_network(11, 3, NetConfig(kind="topk", **SMALL))
    with torch.no_grad():
        dense.gate.load_state_dict(net.gate.state_dict())
        for w, pw in zip(dense.experts.weights, net.experts.weights):
            w.copy_(pw)
        for b, pb in zip(dense.experts.biases, net.experts.biases):
            b.copy_(pb)
    out = dense(x)
    torch.testing.assert_close(out.out, net(x).out)
    return list(torch.autograd.grad(out.out.pow(2).sum(), list(dense.experts.weights)))


def test_sdmoe_gradient_split_matches_eqs_9_10() -> None:
    net = _sd_net(1)
    x = torch.randn(40, 11)
    proxies = _proxy_gradients(net, x)
    net(x).out.pow(2).sum().backward()
    stack = net.experts
    for layer, g in enumerate(proxies):  # g: (E, in, out) proxy gradients
        a, b = stack.bases(layer)
        p_in, p_out = a @ a.T, b @ b.T
        i_in, i_out = torch.eye(p_in.shape[0]), torch.eye(p_out.shape[0])
        g_c = stack.common[layer].grad
        g_u = stack.unique[layer].grad
        # Eq. 9 in the paper's (out, in) orientation, transposed to our (in, out) storage.
        paper = [(p_out @ ge.T + (i_out - p_out) @ ge.T @ p_in).T for ge in g]
        torch.testing.assert_close(g_c, torch.stack(paper).sum(0), rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(g_u, g - torch.stack(paper), rtol=1e-4, atol=1e-6)  # Eq. 10
        torch.testing.assert_close(g_c + g_u.sum(0), g.sum(0), rtol=1e-4, atol=1e-6)  # the split sums to G
        assert (p_in @ g_u).abs().max() < 1e-5 and (g_u @ p_out).abs().max() < 1e-5  # double complement
        assert ((i_in - p_in) @ g_c @ (i_out - p_out)).abs().max() < 1e-5  # touches the shared subspaces only
        assert g_u.abs().max() > 1e-4 and g_c.abs().max() > 1e-4


def test_sdmoe_sgd_step_keeps_unique_parts_in_complement() -> None:
    net = _sd_net(2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    net(torch.randn(30, 11)).out.pow(2).sum().backward()
    opt.step()
    for layer in range(net.experts.n_layers):
        a, b = net.experts.bases(layer)
        u = net.experts.unique[layer].detach()
        assert (a.T @ u).abs().max() < 1e-5 and (u @ b).abs().max() < 1e-5


def test_sdmoe_svd_refresh_keeps_output_and_tracks_w_c() -> None:
    net = _sd_net(3)
    x = torch.randn(25, 11)
    with torch.no_grad():
        for c in net.experts.common:
            c.add_(0.3 * torch.randn_like(c))  # as if W_c had been trained: its singular basis moved
    before = net(x).out.detach()
    net.experts.refresh_bases()
    torch.testing.assert_close(net(x).out, before, rtol=0, atol=0)
    for layer, c in enumerate(net.experts.common):
        a, b = net.experts.bases(layer)
        k = a.shape[1]
        p, _, qh = torch.linalg.svd(c.detach().double())
        torch.testing.assert_close((a @ a.T).double(), p[:, :k] @ p[:, :k].T, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close((b @ b.T).double(), qh[:k].T @ qh[:k], rtol=1e-4, atol=1e-5)


def test_sdmoe_entk_is_that_of_its_proxy_topk_network() -> None:
    from rl_moe.diagnostics import entk_gram

    net = _sd_net(5).double()
    dense = build_network(11, 3, NetConfig(kind="topk", **SMALL)).double()
    with torch.no_grad():
        dense.gate.load_state_dict(net.gate.state_dict())
        for w, pw in zip(dense.experts.weights, net.experts.weights):
            w.copy_(pw)
        for b, pb in zip(dense.experts.biases, net.experts.biases):
            b.copy_(pb)
    x = torch.randn(20, 11, dtype=torch.float64)
    ours, ref = entk_gram(net, x), entk_gram(dense, x)
    torch.testing.assert_close(ours.gram, ref.gram, rtol=1e-10, atol=1e-10)
    assert ours.fallback_params == 0 and ours.expanded_params == 0


def test_sphere_on_top_of_sdmoe_reaches_both_parts() -> None:
    net = _sd_net(4)
    out = net(torch.randn(30, 11))
    loss = Sphere(rank_every=0).network_loss(out, out.out.pow(2).mean())
    grads = torch.autograd.grad(loss, [net.experts.common[0], net.experts.unique[0]])
    assert all(torch.isfinite(g).all() and g.abs().max() > 0 for g in grads)


# ---- DSC ---------------------------------------------------------------------------------------
def _branch(seed: int = 0, m: int = 9, k: int = 3) -> DSCBranch:
    torch.manual_seed(seed)
    return DSCBranch(6, 5, m, k, clamp=2.0, init_scale=0.7)


def test_dsc_coefficients_are_simplex_times_tanh_s() -> None:
    branch = _branch()
    p = branch(torch.randn(50, 6) * 3)
    assert (p.coef >= 0).all()
    torch.testing.assert_close(p.coef.sum(1), torch.tanh(p.signal) * p.signal / (p.signal + DSC_EPS))
    assert (p.logits.abs() <= 2.0).all()  # clamped to [-tau, tau]
    alpha = F.softplus(p.logits)
    torch.testing.assert_close(p.signal, alpha.topk(3, dim=1).values.sum(1))


def _reference_branch(branch: DSCBranch, x: torch.Tensor) -> torch.Tensor:
    """x Delta W(z) per sample, with Delta W = gamma-scaled sum_j z_j u_j^T v_j built explicitly (Eq. 4)."""
    u, v = branch.atoms()
    rows = []
    for xi in x:
        r = (F.layer_norm(xi, xi.shape, branch.norm.weight, branch.norm.bias) @ branch.router.weight.T).clamp(-branch.clamp, branch.clamp)
        alpha = F.softplus(r)
        idx = sorted(range(len(alpha)), key=lambda j: -float(alpha[j].detach()))[: branch.top_k]
        s = sum(alpha[j] for j in idx)
        delta = sum(alpha[j] / (s + DSC_EPS) * torch.tanh(s) * torch.outer(u[j], v[j]) for j in idx)  # (in, out)
        rows.append((xi @ delta) * branch.scale)
    return torch.stack(rows)


def test_dsc_branch_and_network_match_per_sample_reference() -> None:
    branch = _branch(1)
    x = torch.randn(12, 6)
    torch.testing.assert_close(branch(x).out, _reference_branch(branch, x), rtol=1e-5, atol=1e-6)
    torch.manual_seed(2)
    net = build_network(6, 2, NetConfig(kind="dsc", dsc_atoms=7, dsc_top_k=3, hidden=(8, 8)))
    with torch.no_grad():
        for b in net.branches:
            b.scale.fill_(0.9)  # make the residual matter
    h = x
    ws, bs = net.experts.layer_weights(), net.experts.biases
    for layer, b in enumerate(net.branches):
        h = torch.relu(h @ ws[layer][0] + bs[layer][0] + _reference_branch(b, h))
    torch.testing.assert_close(net(x).out, h @ ws[-1][0] + bs[-1][0], rtol=1e-5, atol=1e-6)


def test_dsc_aux_losses_known_answers() -> None:
    eye = torch.eye(4)
    assert frame_potential(eye).item() == 0.0  # orthonormal atoms
    t = 0.3
    two = torch.tensor([[1.0, 0.0], [np.cos(t), np.sin(t)]], dtype=torch.float64)
    assert frame_potential(two).item() == pytest.approx(2 * np.cos(t) ** 2)  # the pair counted twice (i != j)
    logits = torch.randn(7, 5)
    torch.testing.assert_close(dsc_z_loss(logits), torch.stack([torch.log(torch.exp(r).sum()) ** 2 for r in logits]).mean())
    assert dsc_balance_loss(torch.zeros(6, 5)).item() == pytest.approx(1.0)  # uniform: M * M * (1/M)^2
    assert dsc_balance_loss(torch.tensor([[50.0, 0, 0, 0]] * 3)).item() == pytest.approx(4.0, rel=1e-6)  # collapsed: M
    assert budget_loss(torch.tensor([0.4, 2.0]), 1.0).item() == pytest.approx(0.36)
    net = build_network(6, 2, NetConfig(kind="dsc", dsc_atoms=4, hidden=(4,)))
    with torch.no_grad():  # an orthonormal bank: the network's frame term is 0 too
        net.branches[0].u_raw.copy_(torch.eye(4, 6))
        net.branches[0].v_raw.copy_(torch.eye(4))
    x = torch.randn(5, 6)
    out = net(x)
    assert out.aux.dsc.frame.item() == pytest.approx(0.0, abs=1e-12)
    torch.testing.assert_close(out.aux.dsc.signal, net.branches[0](x).signal.mean()[None])


@pytest.mark.parametrize("dims", [(39, 4), (43, 1), (51, 19)])
def test_dsc_active_parameters_match_topk_within_10_percent(dims: tuple[int, int]) -> None:
    cfg = NetConfig(kind="dsc")
    layout = dsc_layout(*dims, cfg)
    assert abs(layout.active_params / layout.topk_active_params - 1) < 0.10
    net = build_network(*dims, cfg)
    k = cfg.dsc_top_k
    counted = sum(p.numel() for p in net.experts.parameters())
    for b in net.branches:  # router, LayerNorm, gamma always active; K of the M atoms per state
        counted += sum(p.numel() for p in (*b.norm.parameters(), b.router.weight, b.scale))
        counted += k * (b.u_raw.shape[1] + b.v_raw.shape[1])
    assert counted == layout.active_params


# ---- SSMoE -------------------------------------------------------------------------------------
def _pair(alpha: float, seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(seed)
    topk = build_network(11, 3, NetConfig(kind="topk", **SMALL))
    ss = build_network(11, 3, NetConfig(kind="ssmoe", ssmoe_alpha=alpha, **SMALL))
    ss.load_state_dict(topk.state_dict())  # same parameters: the EV router has none
    return topk, ss


def test_ssmoe_alpha_zero_is_the_learned_router_exactly() -> None:
    topk, ss = _pair(0.0)
    x = torch.randn(33, 11)
    a, b = topk(x), ss(x)
    assert torch.equal(a.out, b.out) and torch.equal(a.probs, b.probs) and torch.equal(a.indices, b.indices)
    assert torch.equal(EVRerouted(topk, 0.0)(x).out, a.out)


def _ev_logits_numpy(net: torch.nn.Module, x: torch.Tensor, c: int = 2) -> np.ndarray:
    """Algorithm 1 step by step in numpy, expert by expert; r_e = the gate's linear pull-back."""
    w1 = net.experts.weights[0].detach().double().numpy()  # (E, in, H)
    body = net.gate.body[0].weight.detach().double().numpy()  # (G, in)
    rows = net.gate.logits.weight.detach().double().numpy() @ body  # (E, in)
    w_ev = []
    for e in range(net.n_experts):
        _, vecs = np.linalg.eigh(w1[e] @ w1[e].T)
        r = rows[e] / np.linalg.norm(rows[e])
        sims = np.abs(vecs.T @ r)
        chosen = [vecs[:, j] * (1.0 if vecs[:, j] @ r >= 0 else -1.0) for j in np.argsort(-sims)[:c]]
        w_ev.append(np.mean(chosen, axis=0))
    return x.detach().double().numpy() @ np.stack(w_ev).T  # (N, E)


def test_ssmoe_routing_of_a_state_does_not_depend_on_its_batch() -> None:
    _, ss = _pair(0.7, seed=7)
    x = torch.randn(16, 11)
    torch.testing.assert_close(ss(x[:3]).out, ss(x).out[:3])


def test_ssmoe_alpha_one_routes_by_eigenvectors_only() -> None:
    _, ss = _pair(1.0, seed=5)
    x = torch.randn(20, 11)
    out = ss(x)
    ev = _ev_logits_numpy(ss, x)
    expected = np.argsort(-ev, axis=1)[:, :2]
    assert (np.sort(out.indices.numpy(), 1) == np.sort(expected, 1)).all()
    p = np.exp(ev - ev.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    sel = np.take_along_axis(p, expected, 1)
    np.testing.assert_allclose(np.take_along_axis(out.probs.detach().numpy(), expected, 1), sel / sel.sum(1, keepdims=True), rtol=1e-4)
    out.out.sum().backward()
    assert ss.gate.logits.weight.grad is None  # the learned gate plays no part


def test_ssmoe_mixture_is_alpha_p_ev_plus_one_minus_alpha_p_r() -> None:
    _, ss = _pair(0.7, seed=6)
    x = torch.randn(20, 11)
    out = ss(x)
    ev = torch.from_numpy(_ev_logits_numpy(ss, x)).float()
    mixed = 0.7 * torch.softmax(ev, 1) + 0.3 * torch.softmax(ss.gate(x)[1], 1)
    torch.testing.assert_close(torch.softmax(out.logits, 1), mixed, rtol=1e-4, atol=1e-6)
    top = mixed.topk(2, dim=1)
    torch.testing.assert_close(out.probs.gather(1, top.indices), top.values / top.values.sum(1, keepdim=True), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("alpha", [0.7, 1.0])
def test_ssmoe_input_gradient_includes_the_ev_router(alpha: float) -> None:
    # A TD3 critic on x = [obs, action] needs dQ/dx through the EV router's weights too: the
    # autograd gradient must equal central finite differences of the whole layer (float64).
    torch.manual_seed(7)
    ss = build_network(11, 1, NetConfig(kind="ssmoe", ssmoe_alpha=alpha, **SMALL)).double()
    x = torch.randn(6, 11, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(ss(x).out.sum(), x)
    eps = 1e-6
    fd = torch.zeros_like(x)
    with torch.no_grad():
        for i in range(x.shape[0]):
            for j in range(x.shape[1]):
                up, down = x.detach().clone(), x.detach().clone()
                up[i, j] += eps
                down[i, j] -= eps
                fd[i, j] = (ss(up).out[i].sum() - ss(down).out[i].sum()) / (2 * eps)
    torch.testing.assert_close(grad, fd, rtol=1e-5, atol=1e-7)


def test_ssmoe_diagnostics_describe_the_router_they_are_about() -> None:
    # ssmoe_topk_overlap = mean |TopK(x W_EV) & TopK(s(x))| / K, with W_EV built as the layer
    # builds it (the gate's linear pull-back) and s(x) the learned gate's logits (docs/metrics.md).
    from rl_moe.diagnostics.groups import spectral_group
    from rl_moe.diagnostics.ssmoe import topk_overlap
    from rl_moe.diagnostics.views import NetView
    from rl_moe.nn.ssmoe import gate_directions, input_embeddings

    for alpha in (0.7, 1.0):  # alpha = 1 used to fail ("element 0 of tensors does not require grad")
        _, ss = _pair(alpha, seed=8)
        x = torch.randn(64, 11)
        got = spectral_group(NetView(ss, lambda o: o, True), x)
        with torch.no_grad():
            w_ev = input_embeddings(ss.experts.layer_weights()[0], gate_directions(ss.gate), ss.cfg.ssmoe_top_c)
            expected = topk_overlap(x.double() @ w_ev.double().T, ss.gate(x)[1].double(), 2)
        assert got["spectral/ssmoe_topk_overlap"] == pytest.approx(expected)
