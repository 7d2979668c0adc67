"""Stochastic Lanczos quadrature estimate of r_e(K) (SPHERE paper appendix A.5, Eqs. 28-29).

r_e(K) = exp(log tr K - tr(K log K) / tr K). Both traces are Hutchinson averages of
z^T f(K) z ~ ||z||^2 e_1^T f(T_M) e_1 over Gaussian probes z, with T_M the Lanczos tridiagonal
after M steps started at z / ||z||. Products K v = J (J^T v) come from autograd: one backward
(J^T v) and one double-backward (J u) per product; J is never formed. Kept for very large N; the
exact identity in :mod:`rl_moe.diagnostics.entk` is the default.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor, nn

from rl_moe.diagnostics.entk import ForwardFn, _output_tensor

MatVec = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class SlqConfig:
    """SLQ settings.

    :param n_probes: Hutchinson probes (the paper's benchmark setting uses 10). The error falls
        as 1/sqrt(n_probes) and is largest at small r_e: measured RMS relative error at 10 / 64
        probes is about 12% / 5% at r_e ~ 8 and 23-47% / 8-16% at r_e < 3 (docs/metrics.md);
        the plasticity probe uses :data:`PROBE_SLQ_PROBES`
    :param n_steps: Lanczos steps M per probe (30)
    :param seed: seed of the probe generator, so repeated probes of a checkpoint agree
    """

    n_probes: int = 10
    n_steps: int = 30
    seed: int = 0


#: Probes where the estimate is logged (``plasticity/*`` via the probe): 64 keeps the RMS error
#: under ~16% even for r_e < 3, at ~6x the cost of 10.
PROBE_SLQ_PROBES = 64


class SlqEstimate(NamedTuple):
    """Hutchinson/Lanczos estimates of tr K, tr(K log K) and the resulting r_e(K)."""

    trace: float
    trace_xlogx: float
    effective_rank: float


def ntk_matvec(
    module: nn.Module, x: Tensor, forward: ForwardFn | None = None, params: Sequence[Tensor] | None = None
) -> MatVec:
    """v (N,) -> K v = J (J^T v) through autograd for g(x) = sum_d f_d(x), after one forward.

    :param module: parameter owner
    :param x: (N, in) states
    :param forward: x -> Tensor or MoEOutput; default ``module(x)``
    :param params: parameters of J; default all trainable parameters of ``module``
    """
    params = [p for p in (module.parameters() if params is None else params) if p.requires_grad]
    with torch.enable_grad():
        out = _output_tensor((forward or module)(x))
        g = out.reshape(x.shape[0], -1).sum(1)  # (N,)
        u = torch.zeros_like(g, requires_grad=True)
        jt_u = torch.autograd.grad(g, params, grad_outputs=u, create_graph=True, allow_unused=True)  # linear in u
    pairs = [(p, j) for p, j in zip(params, jt_u) if j is not None]
    used = [p for p, _ in pairs]
    jt_u = [j for _, j in pairs]

    def matvec(v: Tensor) -> Tensor:
        jt_v = torch.autograd.grad(g, used, grad_outputs=v.to(g.dtype), retain_graph=True)
        (kv,) = torch.autograd.grad(jt_u, u, grad_outputs=jt_v, retain_graph=True)
        return kv

    return matvec


def lanczos(matvec: MatVec, z: Tensor, n_steps: int) -> Tensor:
    """M-step Lanczos tridiagonal T_M (m, m) in float64 from start z, with full reorthogonalization."""
    q = z.to(torch.float64) / z.norm()
    basis, alphas, betas = [q], [], []
    for step in range(n_steps):
        w = matvec(q.to(z.dtype)).to(torch.float64)
        alpha = float(q @ w)
        alphas.append(alpha)
        qs = torch.stack(basis, 1)  # (N, j)
        for _ in range(2):  # Gram-Schmidt twice keeps the basis orthonormal in finite precision
            w = w - qs @ (qs.T @ w)
        beta = float(w.norm())
        if step == n_steps - 1 or beta <= 1e-10 * max(abs(alpha), 1e-300) or len(basis) == z.shape[0]:
            break
        betas.append(beta)
        q = w / beta
        basis.append(q)
    m = len(alphas)
    t = torch.diag(torch.tensor(alphas, dtype=torch.float64))
    if m > 1:
        off = torch.tensor(betas[: m - 1], dtype=torch.float64)
        t = t + torch.diag(off, 1) + torch.diag(off, -1)
    return t


def slq_estimate(matvec: MatVec, n: int, cfg: SlqConfig = SlqConfig(), device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> SlqEstimate:
    """SLQ estimates of tr K and tr(K log K), plugged into Eq. 28.

    :param matvec: v -> K v for an SPSD K of size n
    :param n: size of K
    :param cfg: probes, Lanczos steps and seed
    """
    gen = torch.Generator(device="cpu").manual_seed(cfg.seed)
    tr, tr_f = 0.0, 0.0
    for _ in range(cfg.n_probes):
        z = torch.randn(n, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)
        t = lanczos(matvec, z, cfg.n_steps)
        theta, vecs = torch.linalg.eigh(t)
        theta = theta.clamp_min(0.0)
        tau = vecs[0] ** 2  # quadrature weights e_1^T U
        scale = float(z.to(torch.float64).norm() ** 2)
        tr += scale * float((tau * theta).sum())
        tr_f += scale * float((tau * torch.special.xlogy(theta, theta)).sum())
    tr, tr_f = tr / cfg.n_probes, tr_f / cfg.n_probes
    # r_e of a non-zero SPSD matrix lies in [1, n]; Hutchinson noise can push the plug-in
    # estimate outside (below 1 for near-rank-one K), so it is clamped.
    rank = min(max(math.exp(math.log(tr) - tr_f / tr), 1.0), float(n)) if tr > 0 else 0.0
    return SlqEstimate(tr, tr_f, rank)


def slq_entk_rank(
    module: nn.Module,
    x: Tensor,
    forward: ForwardFn | None = None,
    params: Sequence[Tensor] | None = None,
    cfg: SlqConfig = SlqConfig(),
) -> SlqEstimate:
    """SLQ estimate of r_e(K) for the eNTK of ``module`` on states ``x`` (SPHERE Eqs. 28-29)."""
    matvec = ntk_matvec(module, x, forward, params)
    return slq_estimate(matvec, x.shape[0], cfg, device=x.device, dtype=x.dtype)
