"""Known answers for the representation, routing and spectral metrics."""

import math

import pytest
import torch

from rl_moe.diagnostics import (
    condition_number,
    dormant_metrics,
    effective_rank,
    ev_embeddings,
    feature_metrics,
    frame_stats,
    gate_input_directions,
    knn_jaccard,
    load_metrics,
    mso,
    principal_similarity,
    routing_metrics,
    sdmoe_metrics,
    silhouette,
    small_gram,
    specialization_metrics,
    top_basis,
    topk_overlap,
)
from rl_moe.nn import Dispatch, ExpertGroup, ExpertPass, MoEOutput, build_network


def test_effective_rank_known_answers() -> None:
    assert effective_rank(torch.eye(7)) == pytest.approx(7.0)
    v = torch.randn(9, 1)
    assert effective_rank(v @ v.T) == pytest.approx(1.0)
    assert effective_rank(torch.diag(torch.tensor([1.0, 1.0, 0.0, 0.0]))) == pytest.approx(2.0)
    assert effective_rank(5.0 * torch.eye(3)) == pytest.approx(3.0)  # scale invariant
    assert effective_rank(torch.zeros(3, 3)) == 0.0
    p = torch.tensor([0.5, 0.25, 0.25])
    assert effective_rank(torch.diag(p)) == pytest.approx(math.exp(-(p * p.log()).sum().item()))


def test_condition_number_and_small_gram() -> None:
    assert condition_number(torch.tensor([1.0, 4.0, 0.0]), rel_floor=1e-10) == pytest.approx(4.0)
    assert condition_number(torch.tensor([2.0, 1e-14, 0.0])) == pytest.approx(2e14)
    assert condition_number(torch.tensor([2.0, 1e-14, 0.0]), rel_floor=1e-10) == pytest.approx(1.0)
    assert math.isinf(condition_number(torch.zeros(3)))
    phi = torch.randn(6, 20, dtype=torch.float64)  # N < m: sample-space Gram
    ev_small = torch.linalg.eigvalsh(small_gram(phi))
    ev_big = torch.linalg.eigvalsh(phi.T @ phi / 6)[-6:]
    assert small_gram(phi).shape == (6, 6)
    assert torch.allclose(ev_small, ev_big, atol=1e-10)


def test_stable_rank_known_answers() -> None:
    from rl_moe.diagnostics.linalg import stable_rank

    diag = torch.diag(torch.tensor([3.0, 1.0, 1.0, 0.0]))  # ||W||_F^2 = 11, ||W||_2^2 = 9
    assert float(stable_rank(diag)) == pytest.approx(11 / 9)
    batch = torch.stack([torch.eye(4), torch.outer(torch.arange(1.0, 5.0), torch.ones(4)), torch.zeros(4, 4)])
    torch.testing.assert_close(stable_rank(batch), torch.tensor([4.0, 1.0, 0.0], dtype=torch.float64))


def test_spectral_group_logs_each_experts_last_hidden_stable_rank() -> None:
    from rl_moe.diagnostics.groups import spectral_group
    from rl_moe.diagnostics.views import NetView

    torch.manual_seed(0)
    net = build_network(5, 2, kind="topk", n_experts=3, hidden=(8, 6), gate_hidden=(4,))
    with torch.no_grad():  # last hidden layers (E, 8, 6); expert 2 keeps its orthogonal init
        net.experts.weights[1][0] = torch.zeros(8, 6)
        net.experts.weights[1][0, :3, :3] = torch.diag(torch.tensor([3.0, 1.0, 1.0]))
        net.experts.weights[1][1] = torch.outer(torch.ones(8), torch.arange(6.0))  # rank one
    out = spectral_group(NetView(net, lambda x: x, True), torch.randn(16, 5))
    # 11/9 as above, 1 for rank one, 6 for an orthogonal 8x6 matrix (all singular values equal)
    assert out["spectral/expert_stable_rank"] == pytest.approx((11 / 9 + 1 + 6) / 3)
    assert out["spectral/expert_stable_rank_min"] == pytest.approx(1.0)


def test_feature_metrics_match_feature_space_gram() -> None:
    torch.manual_seed(0)
    net = build_network(5, 2, kind="topk", n_experts=4, top_k=2, hidden=(8, 8), gate_hidden=(8,)).double()
    out = net(torch.randn(40, 5, dtype=torch.float64))
    phi = out.phi(-1, weighted=True).detach()  # (40, 32): m < N, feature-space Gram
    a = phi.T @ phi / 40
    got = feature_metrics(out)
    assert got["feature_rank"] == pytest.approx(effective_rank(a), rel=1e-9)
    assert got["feature_norm"] == pytest.approx(float(phi.norm(dim=1).mean()), rel=1e-9)
    ev = torch.linalg.eigvalsh(a)
    kept = ev[ev > 1e-10 * ev.max()]
    assert got["feature_cond"] == pytest.approx(float(kept.max() / kept.min()), rel=1e-6)


def _single_layer_output(hidden: torch.Tensor, expert_idx: torch.Tensor, n_experts: int) -> MoEOutput:
    counts = tuple(torch.bincount(expert_idx, minlength=n_experts).tolist())
    r = hidden.shape[0]
    dispatch = Dispatch(torch.arange(r), expert_idx, torch.ones(r), counts, r)
    ep = ExpertPass(hidden[:, :1], (hidden,), (hidden,), (hidden,), (hidden,), ())
    z = torch.zeros(r, n_experts)
    return MoEOutput(hidden[:, :1], z, expert_idx[:, None], z, torch.zeros(r, 0), (ExpertGroup(dispatch, ep),))


def test_dormant_ratio_known_dead_units() -> None:
    # Expert 0: unit 3 silent (dormant at tau=0 and 0.025), unit 2 tiny (score 0.01 / 0.5025 ~ 0.02,
    # dormant at 0.025 only). Expert 1: all alive. Expert 2: no rows, left out.
    h0 = torch.tensor([[1.0, 1.0, 0.01, 0.0], [1.0, 1.0, 0.01, 0.0]])
    h1 = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    out = _single_layer_output(torch.cat([h0, h1]), torch.tensor([0, 0, 1]), 3)
    got = dormant_metrics(out)
    assert got["dormant_ratio"] == pytest.approx(2 / 8)
    assert got["dormant_ratio_l0"] == pytest.approx(2 / 8)
    assert got["dormant_ratio_tau0"] == pytest.approx(1 / 8)


def test_dormant_ratio_dense_mlp_with_dead_biases() -> None:
    torch.manual_seed(0)
    net = build_network(4, 2, kind="mlp", hidden=(10, 10))
    with torch.no_grad():
        net.experts.biases[0][0, :4] = -1e4  # 4 of 10 first-layer units never fire
        net.experts.weights[1][0].abs_()  # layer 2 sees only non-negative weights ...
        net.experts.biases[1][0].fill_(1.0)  # ... and a positive bias: always active
    out = net(torch.randn(64, 4))
    got = dormant_metrics(out)
    assert got["dormant_ratio_tau0_l0"] == pytest.approx(0.4)
    assert got["dormant_ratio_tau0_l1"] == 0.0
    assert got["dormant_ratio_tau0"] == pytest.approx(4 / 20)  # pooled over units, not layers
    # ReDo's score recomputed from the activations: s_i = E|h_i| / mean_j E|h_j|, dormant if <= 0.025.
    hidden = out.groups[0].expert.hidden
    dead = sum(int((h.abs().mean(0) / h.abs().mean() <= 0.025).sum()) for h in hidden)
    assert got["dormant_ratio"] == pytest.approx(dead / 20)


def test_mso_and_frames() -> None:
    eye = torch.eye(4).reshape(4, 2, 2)  # orthogonal flattened "expert weights"
    assert mso(eye) == pytest.approx(0.0)
    same = torch.randn(1, 3, 5).expand(4, 3, 5)
    assert mso(same) == pytest.approx(1.0)
    d = 3  # simplex frame: d + 1 equiangular unit vectors in R^d, <u_i, u_j> = -1/d
    centered = torch.eye(d + 1, dtype=torch.float64) - 1.0 / (d + 1)
    basis = torch.linalg.svd(centered).U[:, :d]  # coordinates in the d-dim span
    frame = basis * math.sqrt((d + 1) / d)
    fs = frame_stats(frame)
    assert fs.potential == pytest.approx(fs.potential_bound)
    assert fs.potential_bound == pytest.approx((d + 1) / d)
    assert fs.coherence == pytest.approx(fs.coherence_bound)
    assert fs.coherence == pytest.approx(1 / d)
    rand = frame_stats(torch.randn(8, 3, dtype=torch.float64))
    assert rand.potential > rand.potential_bound and rand.coherence > rand.coherence_bound


def test_subspace_similarity_identical_and_orthogonal() -> None:
    n = 120  # top 1% of 120 -> k = 1
    w = torch.zeros(3, n, n, dtype=torch.float64)
    w[:, torch.arange(n), torch.arange(n)] = 0.1
    w[0, 0, 0] = w[1, 0, 0] = 5.0  # experts 0 and 1 share their leading input direction e_0
    w[2, 1, 1] = 5.0  # expert 2 leads along e_1
    sim = principal_similarity(top_basis(w, "in"))
    assert sim[0, 1] == pytest.approx(1.0)
    assert sim[0, 2] == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="valid choices: in, out"):
        top_basis(w, "middle")
    same = torch.randn(1, 50, 40).expand(4, 50, 40)
    got = sdmoe_metrics([same, same], grads=[same, None], gate_dirs=None)
    assert got["sdmoe_param_sim_in"] == pytest.approx(1.0)
    assert got["sdmoe_param_sim_out"] == pytest.approx(1.0)
    assert got["sdmoe_grad_sim_in"] == pytest.approx(1.0)


def test_silhouette_matches_definition() -> None:
    gen = torch.Generator().manual_seed(0)
    pts = torch.randn(30, 4, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 3, (30,), generator=gen)
    labels[0] = 5  # a singleton cluster scores 0
    dist = torch.cdist(pts, pts)
    scores = []
    for i in range(30):
        same = (labels == labels[i]) & (torch.arange(30) != i)
        if not same.any():
            scores.append(0.0)
            continue
        a = dist[i, same].mean()
        b = min(dist[i, labels == c].mean() for c in labels.unique() if c != labels[i])
        scores.append(float((b - a) / max(a, b)))
    assert silhouette(pts, labels) == pytest.approx(sum(scores) / 30, rel=1e-9)
    far = torch.cat([torch.zeros(5, 2), torch.full((5, 2), 100.0)])
    assert silhouette(far + 0.01 * torch.randn(10, 2), torch.tensor([0] * 5 + [1] * 5)) > 0.99


def test_knn_jaccard_and_load() -> None:
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [0, 1, 1, 0]], dtype=torch.bool)
    pts = torch.tensor([[0.0], [0.1], [10.0], [10.1]])
    # neighbours: 0<->1 (identical sets: 1), 2<->3 ({0,2} vs {1,2}: 1/3)
    assert knn_jaccard(pts, mask, k=1) == pytest.approx((1 + 1 + 1 / 3 + 1 / 3) / 4)
    got = load_metrics(mask)  # c = [3, 3, 2, 0], c_bar = 2
    assert got["max_vio"] == pytest.approx(1.0)
    assert got["active_ratio"] == pytest.approx(0.75)
    p = torch.tensor([3, 3, 2]) / 8.0
    assert got["entropy"] == pytest.approx(float(-(p * p.log()).sum() / math.log(4)))
    assert got["load_e3"] == 0.0


def test_specialization_identical_experts_fully_overlap() -> None:
    torch.manual_seed(0)
    net = build_network(5, 3, kind="dense_moe", n_experts=4, hidden=(8, 8), gate_hidden=(6,))
    with torch.no_grad():
        for p in list(net.experts.weights) + list(net.experts.biases):
            p.copy_(p[:1].expand_as(p))
    out = net(torch.randn(50, 5))
    got = specialization_metrics(out)
    assert got["overlap"] == pytest.approx(1.0)
    assert got["orthogonality"] == pytest.approx(0.0, abs=1e-9)
    assert got["mso_act"] == pytest.approx(1.0)
    full = routing_metrics(out)
    assert full["active_ratio"] == 1.0 and full["knn_jaccard"] == pytest.approx(1.0)


def test_gate_directions_of_linear_gate_are_its_rows() -> None:
    net = build_network(5, 2, kind="topk", n_experts=4, top_k=2, hidden=(8,), gate_hidden=())
    dirs = gate_input_directions(net, torch.randn(16, 5))
    assert torch.allclose(dirs, net.gate.logits.weight.detach(), atol=1e-6)


def test_ev_embeddings_recover_rank_one_direction() -> None:
    gen = torch.Generator().manual_seed(0)
    u = torch.nn.functional.normalize(torch.randn(3, 6, generator=gen, dtype=torch.float64), dim=1)  # (E, in)
    v = torch.randn(3, 8, generator=gen, dtype=torch.float64)
    first = u[:, :, None] * v[:, None, :]  # W1 = u v^T: top eigenvector of W1 W1^T is u
    last = torch.randn(3, 8, 2, generator=gen, dtype=torch.float64)
    emb_in, basis_out = ev_embeddings(first, last, router_dirs=u, c=1)
    assert torch.allclose(emb_in, u, atol=1e-8)  # sign-aligned to the router direction
    assert basis_out.shape == (3, 2, 1)
    # Known answer: state 0 shares 1 of its top-2 experts, state 1 both -> mean overlap 3/4.
    a = torch.tensor([[3.0, 2.0, 1.0, 0.0], [0.0, 1.0, 2.0, 3.0]])
    b = torch.tensor([[3.0, 0.0, 2.0, 1.0], [0.0, 1.0, 3.0, 2.0]])
    assert topk_overlap(a, b, 2) == pytest.approx(0.75)
    assert topk_overlap(a, -a, 2) == 0.0


def test_output_side_similarity_is_sign_free() -> None:
    # Two experts with the same head Gram (W and R W, R orthogonal) have the same output-side
    # subspace: the similarity must be 1 on every draw (a sign-aligned average gave 0 or 1 at random).
    from rl_moe.diagnostics.ssmoe import subspace_similarity

    gen = torch.Generator().manual_seed(1)
    for _ in range(50):
        w = torch.randn(8, 4, generator=gen, dtype=torch.float64)
        r, _ = torch.linalg.qr(torch.randn(8, 8, generator=gen, dtype=torch.float64))
        last = torch.stack([w, r @ w, torch.randn(8, 4, generator=gen, dtype=torch.float64)])  # (E, H_L, out)
        first = torch.randn(3, 5, 8, generator=gen, dtype=torch.float64)
        _, basis = ev_embeddings(first, last, router_dirs=torch.randn(3, 5, generator=gen, dtype=torch.float64), c=2)
        sim = subspace_similarity(basis)
        assert float(sim[0, 1]) == pytest.approx(1.0, abs=1e-9)
        assert torch.allclose(sim, sim.T) and torch.allclose(torch.diagonal(sim), torch.ones(3, dtype=torch.float64))
    # Known answer: orthogonal 1-dim subspaces give 0, a 45-degree pair gives cos 45.
    e = torch.eye(2, dtype=torch.float64)
    bases = torch.stack([e[:, :1], e[:, 1:], (e[:, :1] + e[:, 1:]) / 2**0.5])
    sim = subspace_similarity(bases)
    assert float(sim[0, 1]) == pytest.approx(0.0) and float(sim[0, 2]) == pytest.approx(2**-0.5)
