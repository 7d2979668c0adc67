"""Vectorized MoE forward against a per-sample reference; gradients; Phi accessor."""

import pytest
import torch

from rl_moe.nn import NETWORK_KINDS, NetConfig, build_network
from rl_moe.nn.dsc import frame_potential
from rl_moe.nn.experts import StackedExperts, segment_matmul
from rl_moe.nn.moe import load_balance_loss



@pytest.fixture(autouse=True)
def _float64():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def _expert_mlp(experts: StackedExperts, e: int, x: torch.Tensor) -> torch.Tensor:
    """One sample (in,) through expert e, written as plain per-layer algebra."""
    h = x
    act = torch.relu if experts.activation == "relu" else torch.tanh
    for layer in range(len(experts.hidden_dims)):
        z = h @ experts.weights[layer][e] + experts.biases[layer][e]
        if experts.layer_norm:
            z = (z - z.mean()) / torch.sqrt(z.var(unbiased=False) + 1e-5)
            z = z * experts.ln_weights[layer][e] + experts.ln_biases[layer][e]
        h = act(z)
    return h @ experts.weights[-1][e] + experts.biases[-1][e]


def _dsc_branch(branch, h: torch.Tensor) -> torch.Tensor:
    """One sample through a DSC branch with Delta W built explicitly (DSC Eqs. 3-5)."""
    r = torch.nn.functional.layer_norm(h, h.shape, branch.norm.weight, branch.norm.bias) @ branch.router.weight.T
    alpha = torch.nn.functional.softplus(r.clamp(-branch.clamp, branch.clamp))
    top = alpha.topk(branch.top_k).indices
    s = alpha[top].sum()
    u = branch.u_raw / branch.u_raw.norm(dim=1, keepdim=True)
    v = branch.v_raw / branch.v_raw.norm(dim=1, keepdim=True)
    delta = sum(alpha[j] / (s + 1e-6) * torch.tanh(s) * torch.outer(u[j], v[j]) for j in top)
    return (h @ delta) * branch.scale


def _dsc_mlp(net, x: torch.Tensor) -> torch.Tensor:
    ex, h = net.experts, x
    for layer, branch in enumerate(net.branches):
        z = h @ ex.weights[layer][0] + ex.biases[layer][0] + _dsc_branch(branch, h)
        if ex.layer_norm:
            z = (z - z.mean()) / torch.sqrt(z.var(unbiased=False) + 1e-5)
            z = z * ex.ln_weights[layer][0] + ex.ln_biases[layer][0]
        h = torch.relu(z)
    return h @ ex.weights[-1][0] + ex.biases[-1][0]


def _reference(net, x: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    kind = net.cfg.kind
    outs = []
    for i in range(x.shape[0]):
        if kind == "mlp":
            outs.append(_expert_mlp(net.experts, 0, x[i]))
            continue
        if kind == "dsc":
            outs.append(_dsc_mlp(net, x[i]))
            continue
        if kind == "soft":
            tokens = (x[i] @ net.tokenizer.weight.T + net.tokenizer.bias).view(net.n_experts, -1)
            scores = tokens @ net.slot_keys / net.cfg.temperature
            slots = torch.softmax(scores, 0).T @ tokens  # (E, d)
            cbar = torch.softmax(scores, 1).mean(0)
            outs.append(sum(cbar[e] * _expert_mlp(net.experts, e, slots[e]) for e in range(net.n_experts)))
            continue
        y = sum(probs[i, e] * _expert_mlp(net.experts, e, x[i]) for e in range(probs.shape[1]) if probs[i, e] > 0)
        if kind == "ds":
            y = y + sum(_expert_mlp(net.shared, s, x[i]) for s in range(net.cfg.n_shared))
        outs.append(y)
    return torch.stack(outs)


@pytest.mark.parametrize("layer_norm", [False, True])
@pytest.mark.parametrize("kind", NETWORK_KINDS)
def test_vectorized_equals_per_sample_reference(kind, layer_norm):
    torch.manual_seed(0)
    cfg = NetConfig(kind=kind, n_experts=5, top_k=2, hidden=(12, 10, 8), gate_hidden=(9,), layer_norm=layer_norm, temperature=0.8)
    net = build_network(7, 3, cfg)
    x = torch.randn(23, 7)
    out = net(x)
    ref = _reference(net, x, out.probs)
    assert torch.allclose(out.out, ref, atol=1e-10), (out.out - ref).abs().max()
    if kind == "ssmoe":
        return  # orthogonal init makes W1 W1^T = gain^2 I: its eigenbasis, hence the EV router, is arbitrary across dtypes
    # float32 path as used in training, to about 1e-6.
    net32 = build_network(7, 3, cfg).float()
    net32.load_state_dict({k: v.float() for k, v in net.state_dict().items()})
    assert torch.allclose(net32(x.float()).out.double(), ref, atol=1e-5)


@pytest.mark.parametrize("kind", ["topk", "dense_moe", "expert_choice", "ds", "soft"])
def test_gradients_reach_gate_and_every_selected_expert(kind):
    torch.manual_seed(1)
    net = build_network(6, 2, NetConfig(kind=kind, n_experts=4, top_k=2, hidden=(8, 8), gate_hidden=(8,)))
    x = torch.randn(64, 6)
    out = net(x)
    out.out.pow(2).sum().backward()
    gate_params = list(net.gate.parameters()) if hasattr(net, "gate") else [net.tokenizer.weight, net.slot_keys]
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in gate_params)
    selected = out.probs.gt(0).any(0)  # experts used by at least one state
    for w in net.experts.weights:
        per_expert = w.grad.flatten(1).abs().sum(1)
        assert torch.all(per_expert[selected] > 0)
        assert torch.all(per_expert[~selected] == 0)


def test_unselected_expert_gets_no_gradient_and_no_compute():
    torch.manual_seed(2)
    net = build_network(4, 1, NetConfig(kind="topk", n_experts=6, top_k=1, hidden=(5,), gate_hidden=(3,)))
    with torch.no_grad():
        net.gate.logits.weight.zero_()
        net.gate.logits.bias.copy_(torch.tensor([0.0, 9.0, 0.0, 0.0, 0.0, 0.0]))
    out = net(torch.randn(10, 4))
    assert out.groups[0].dispatch.counts == (0, 10, 0, 0, 0, 0)
    out.out.sum().backward()
    g = net.experts.weights[0].grad.flatten(1).abs().sum(1)
    assert g[1] > 0 and torch.all(g[[0, 2, 3, 4, 5]] == 0)


def test_segment_matmul_matches_loop_including_empty_segments():
    torch.manual_seed(3)
    for n_experts in (3, 40):  # the second one takes the grouped kernel where available
        counts = tuple(int(c) for c in torch.randint(0, 4, (n_experts,)))
        x = torch.randn(sum(counts), 8, dtype=torch.float32)
        w = torch.randn(n_experts, 8, 4, dtype=torch.float32)
        ref = torch.cat([xb @ w[e] for e, xb in enumerate(torch.split(x, counts))])
        assert torch.allclose(segment_matmul(x, w, counts), ref, atol=1e-5)


def test_segment_matmul_bias_matches_a_per_row_gather_in_value_and_gradient():
    torch.manual_seed(4)
    for n_experts in (1, 3, 40):
        counts = tuple(int(c) for c in torch.randint(0, 4, (n_experts,)))
        counts = counts if sum(counts) else (2,) + counts[1:]
        idx = torch.repeat_interleave(torch.arange(n_experts), torch.tensor(counts))
        x = torch.randn(sum(counts), 8, requires_grad=True)
        w = torch.randn(n_experts, 8, 4, requires_grad=True)
        b = torch.randn(n_experts, 4, requires_grad=True)
        got = segment_matmul(x, w, counts, b)
        ref = torch.einsum("ri,rio->ro", x, w[idx]) + b[idx]
        assert torch.allclose(got, ref, atol=1e-5)
        upstream = torch.randn_like(ref)
        g_got = torch.autograd.grad(got, (x, w, b), upstream)
        g_ref = torch.autograd.grad(ref, (x, w, b), upstream)
        for a, r in zip(g_got, g_ref):
            assert torch.allclose(a, r, atol=1e-4)
        assert torch.all(g_got[2][torch.tensor(counts) == 0] == 0)  # an expert with no rows learns nothing


def test_segment_matmul_without_autograd_is_bit_identical_to_the_autograd_path():
    """Acting and evaluation take the active-experts path; it must not change a single bit."""
    torch.manual_seed(5)
    for counts in ((0, 7, 0, 0, 5, 0), (3, 0, 0), (0, 0, 4), (2, 3, 1)):
        x = torch.randn(sum(counts), 39)
        w = torch.randn(len(counts), 39, 16, requires_grad=True)
        b = torch.randn(len(counts), 16, requires_grad=True)
        for bias in (b, None):
            with_grad = segment_matmul(x, w, counts, bias)
            with torch.no_grad():
                without = segment_matmul(x, w, counts, bias)
            assert with_grad.requires_grad and not without.requires_grad
            assert torch.equal(with_grad.detach(), without)
    with torch.no_grad():  # no routed rows at all
        assert segment_matmul(torch.randn(0, 39), w, (0, 0, 0)).shape == (0, 16)


@pytest.mark.parametrize("kind", ["topk", "dense_moe", "ds", "expert_choice", "ssmoe", "soft", "mlp", "dsc"])
def test_network_forward_without_autograd_is_bit_identical(kind):
    """The same numbers without autograd (acting, evaluation, probes), which also skips the gate's
    load-balance loss and DSC's auxiliary terms: only a training forward's regularizers read them."""
    torch.manual_seed(6)
    net = build_network(39, 4, NetConfig(kind=kind, n_experts=10, top_k=2, hidden=(32, 32), gate_hidden=(32,)))
    x = torch.randn(8, 39)
    with_grad = net(x)
    with torch.no_grad():
        without = net(x)
    assert torch.equal(with_grad.out.detach(), without.out)
    for g, h in zip(with_grad.groups, without.groups):
        assert g.dispatch.counts == h.dispatch.counts
        for a, b in zip(g.expert.hidden, h.expert.hidden):
            assert torch.equal(a.detach(), b)
    if kind not in ("mlp", "dsc"):  # the dense baseline has no gate; DSC's terms are its own
        expected = load_balance_loss(with_grad.logits.detach(), with_grad.probs.detach() > 0)  # the routing's own selection
        assert with_grad.aux.load_balance.requires_grad and torch.equal(with_grad.aux.load_balance.detach(), expected)
    if kind == "dsc":  # the frame potential of every bank (DSC Eq. 11), one signal per branch
        frame = sum(frame_potential(u) + frame_potential(v) for u, v in (b.atoms() for b in net.branches))
        assert with_grad.aux.dsc.frame.requires_grad and torch.equal(with_grad.aux.dsc.frame.detach(), frame.detach())
        assert with_grad.aux.dsc.signal.shape == (len(net.branches),)
    assert without.aux.load_balance is None and without.aux.dsc is None


@pytest.mark.parametrize("kind", NETWORK_KINDS)
def test_phi_has_routing_weighted_blocks(kind):
    torch.manual_seed(4)
    net = build_network(5, 2, NetConfig(kind=kind, n_experts=3, top_k=2, hidden=(4, 6), gate_hidden=(4,)))
    out = net(torch.randn(9, 5))
    phi = out.phi()
    group = out.groups[-1]
    h = group.dispatch.n_experts
    assert phi.shape == (9, sum(g.dispatch.n_experts * g.expert.hidden[-1].shape[1] for g in out.groups))
    # Routed block of the last group for one (state, expert) pair equals weight * feature.
    d = group.dispatch
    r = 0
    i, e = int(d.sample_idx[r]), int(d.expert_idx[r])
    width = group.expert.hidden[-1].shape[1]
    offset = phi.shape[1] - h * width
    block = phi[i, offset + e * width : offset + (e + 1) * width]
    assert torch.allclose(block, d.weight[r] * group.expert.hidden[-1][r])
    assert torch.allclose(out.phi(weighted=False)[i, offset + e * width : offset + (e + 1) * width], group.expert.hidden[-1][r])
