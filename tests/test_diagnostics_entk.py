"""Exact eNTK (layerwise Gram identity) against brute-force per-sample Jacobians, and SLQ."""

import math

import pytest
import torch
from torch import nn
from torch.func import functional_call, jacrev

from rl_moe.diagnostics import (
    SequentialAsMoE,
    SlqConfig,
    block_cosine,
    effective_rank,
    entk_gram,
    gate_expert_coupling,
    ntk_effective_rank,
    ntk_matvec,
    slq_entk_rank,
    slq_estimate,
)
from rl_moe.diagnostics.coupling import expert_and_gate_params
from rl_moe.nn import NETWORK_KINDS, build_network

N, IN, OUT = 32, 5, 3


def brute_jacobian(module: nn.Module, x: torch.Tensor, names: set[str] | None = None) -> torch.Tensor:
    """J (N, P): per-sample gradients of g = sum_d out_d from torch.func over the whole batch."""
    params = {k: v.detach() for k, v in module.named_parameters() if names is None or k in names}

    def g(p):
        return functional_call(module, p, (x,), strict=False).out.sum(1)

    jac = jacrev(g)(params)
    return torch.cat([j.reshape(x.shape[0], -1) for j in jac.values()], dim=1).detach()


def small_net(kind: str, layer_norm: bool) -> nn.Module:
    torch.manual_seed(0)
    net = build_network(IN, OUT, kind=kind, n_experts=4, top_k=2, hidden=(16, 16), gate_hidden=(8,), layer_norm=layer_norm)
    with torch.no_grad():  # non-trivial LayerNorm affine parameters
        for name, p in net.named_parameters():
            if "ln_" in name:
                p.add_(0.3 * torch.randn_like(p))
        for module in net.modules():
            if isinstance(module, nn.LayerNorm):
                module.weight.add_(0.3 * torch.randn_like(module.weight))
                module.bias.add_(0.3 * torch.randn_like(module.bias))
    return net.double()


@pytest.mark.parametrize("layer_norm", [False, True])
@pytest.mark.parametrize("kind", NETWORK_KINDS)
def test_exact_entk_matches_brute_force(kind: str, layer_norm: bool) -> None:
    if kind == "sdmoe":
        pytest.skip("SD-MoE's eNTK is its proxy Top-K MoE's (test_companion_nets), not that of its split gradients")
    net = small_net(kind, layer_norm)
    x = torch.randn(N, IN, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    result = entk_gram(net, x)
    jac = brute_jacobian(net, x)
    k_ref = jac @ jac.T
    assert result.n_params == jac.shape[1]
    assert torch.allclose(result.gram, k_ref, rtol=1e-10, atol=1e-10 * float(k_ref.abs().max()))
    r_ref = math.exp(-sum(float(p * math.log(p)) for p in (torch.linalg.eigvalsh(k_ref).clamp_min(0) / k_ref.trace()) if p > 0))
    assert effective_rank(result.gram) == pytest.approx(r_ref, rel=1e-5)
    # only SoftMoE's bare slot_keys need per-state copies; only DSC (atom banks, and a trunk
    # that runs outside StackedExperts.forward) needs the batched per-sample fallback
    assert (result.expanded_params > 0) == (kind == "soft")
    assert (result.fallback_params > 0) == (kind == "dsc")


class BareMatmul(nn.Module):
    """A bare parameter in a matmul that does not broadcast over a per-state copy."""

    def __init__(self) -> None:
        super().__init__()
        self.keys = nn.Parameter(torch.randn(IN, 4))
        self.head = nn.Linear(4, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(x @ self.keys))


def test_exact_entk_bare_parameter_fallback() -> None:
    torch.manual_seed(0)
    net = BareMatmul().double()
    x = torch.randn(N, IN, dtype=torch.float64)
    params = dict(net.named_parameters())
    jac = torch.func.jacrev(lambda p: torch.func.functional_call(net, p, (x,)).sum(1))(params)
    flat = torch.cat([j.reshape(N, -1) for j in jac.values()], 1).detach()
    result = entk_gram(net, x)
    assert result.fallback_params == IN * 4 and result.expanded_params == 0
    assert torch.allclose(result.gram, flat @ flat.T, rtol=1e-10, atol=1e-12)


def test_exact_entk_sb3_style_mlp_with_layernorm_and_tanh() -> None:
    torch.manual_seed(0)
    layers = [nn.Linear(IN, 12), nn.LayerNorm(12), nn.Tanh(), nn.Linear(12, 12), nn.Tanh(), nn.Linear(12, OUT), nn.Tanh()]
    net = SequentialAsMoE(layers).double()
    x = torch.randn(N, IN, dtype=torch.float64)
    jac = brute_jacobian(net, x)
    assert torch.allclose(entk_gram(net, x).gram, jac @ jac.T, rtol=1e-10, atol=1e-12)


def test_exact_entk_parameter_subset_and_gn_coupling() -> None:
    net = small_net("topk", True)
    x = torch.randn(N, IN, dtype=torch.float64)
    _, gate = expert_and_gate_params(net)
    names = {k for k, v in net.named_parameters() if any(v is p for p in gate)}
    jac_gate = brute_jacobian(net, x, names)
    assert torch.allclose(entk_gram(net, x, params=gate).gram, jac_gate @ jac_gate.T, rtol=1e-10, atol=1e-12)
    jac = brute_jacobian(net, x)
    jac_exp = brute_jacobian(net, x, {k for k, _ in net.named_parameters()} - names)
    assert jac.shape[1] == jac_gate.shape[1] + jac_exp.shape[1]
    gn = lambda a, b: torch.linalg.matrix_norm(a.T @ b)
    ref = float(gn(jac_gate, jac_exp) / torch.sqrt(gn(jac_gate, jac_gate) * gn(jac_exp, jac_exp)))
    assert gate_expert_coupling(net, x)["gn_coupling"] == pytest.approx(ref, rel=1e-8)
    assert 0.0 < ref < 1.0
    # Known answers: J_a = e_1, J_b = (1, 1) -> ||J_a^T J_b|| / sqrt(||J_a^T J_a|| ||J_b^T J_b||) = 1/sqrt(2).
    j_a, j_b, j_c = (torch.tensor(v, dtype=torch.float64)[:, None] for v in ([1.0, 0.0], [1.0, 1.0], [0.0, 1.0]))
    assert block_cosine(j_a @ j_a.T, j_b @ j_b.T) == pytest.approx(2**-0.5)
    assert block_cosine(j_a @ j_a.T, j_c @ j_c.T) == 0.0  # orthogonal gradients


def test_ntk_matvec_matches_exact_gram() -> None:
    net = small_net("expert_choice", False)
    x = torch.randn(N, IN, dtype=torch.float64)
    k = entk_gram(net, x).gram
    v = torch.randn(N, dtype=torch.float64)
    assert torch.allclose(ntk_matvec(net, x)(v), k @ v, rtol=1e-9, atol=1e-9)


def test_slq_on_known_spectrum() -> None:
    n = 200
    q, _ = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64))
    lam = torch.linspace(1.0, 3.0, n, dtype=torch.float64)
    lam[:20] = 0.0  # rank-deficient like an eNTK
    k = q @ torch.diag(lam) @ q.T
    est = slq_estimate(lambda v: k @ v, n, SlqConfig(n_probes=30, n_steps=25), dtype=torch.float64)
    assert est.effective_rank == pytest.approx(effective_rank(k), rel=0.03)
    assert est.trace == pytest.approx(float(lam.sum()), rel=0.1)


def test_slq_on_entk_close_to_exact() -> None:
    net = small_net("topk", False)
    x = torch.randn(64, IN, dtype=torch.float64)
    jac = brute_jacobian(net, x)  # (N, P) by finite autograd rows, independent of entk_gram
    exact = ntk_effective_rank(net, x)
    assert exact == pytest.approx(effective_rank(jac @ jac.T), rel=1e-8)
    with pytest.raises(ValueError, match="unknown eNTK method 'lanczos'; valid choices: exact, slq"):
        ntk_effective_rank(net, x, "lanczos")
    est = slq_entk_rank(net, x, cfg=SlqConfig(n_probes=32, n_steps=30))
    assert est.effective_rank == pytest.approx(exact, rel=0.3)  # one draw: about 4 RMS errors
    assert est.trace == pytest.approx(float(torch.trace(jac @ jac.T)), rel=0.3)


def _spectrum(decay: float, n: int = 128) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    return q @ torch.diag(torch.exp(-torch.arange(n, dtype=torch.float64) / decay)) @ q.T


def test_slq_error_at_the_probe_default_is_small_even_at_low_rank() -> None:
    """Measured over seeds on a known spectrum with r_e ~ 2.8 (docs/metrics.md): the probe's
    64 probes keep the RMS relative error near 10%; 10 probes give about 25%."""
    from rl_moe.diagnostics.probe import ProbeConfig

    k = _spectrum(1.0)
    exact = effective_rank(k)
    assert exact < 3
    n_probes = ProbeConfig().slq.n_probes
    assert n_probes >= 64
    ests = [slq_estimate(lambda v: k @ v, 128, SlqConfig(n_probes=n_probes, seed=s), dtype=torch.float64).effective_rank for s in range(8)]
    rms = (sum(((e - exact) / exact) ** 2 for e in ests) / len(ests)) ** 0.5
    assert rms < 0.15, ests


def test_slq_estimate_is_clamped_to_one_and_n() -> None:
    k = _spectrum(0.3)  # r_e ~ 1.2: Hutchinson noise pushed 10-probe estimates down to 0.55
    ests = [slq_estimate(lambda v: k @ v, 128, SlqConfig(n_probes=4, seed=s), dtype=torch.float64).effective_rank for s in range(20)]
    assert min(ests) >= 1.0 and max(ests) <= 128
