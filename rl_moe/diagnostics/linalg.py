"""Spectral utilities shared by every diagnostic: effective rank, condition number, smaller Gram."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def spsd_eigvals(m: Tensor) -> Tensor:
    """Eigenvalues of a symmetric positive semi-definite matrix, in float64, clamped at 0.

    Round-off can make tiny eigenvalues slightly negative; they carry no spectral mass.

    :param m: (n, n) SPSD matrix
    :return: (n,) ascending eigenvalues >= 0
    """
    m = m.detach().to(torch.float64)
    m = 0.5 * (m + m.T)
    return torch.linalg.eigvalsh(m).clamp_min(0.0)


def effective_rank_from_eigvals(eigvals: Tensor) -> float:
    """r_e = exp(-sum p_i log p_i), p_i = lambda_i / sum lambda over lambda_i > 0 (SPHERE Eq. 7).

    :param eigvals: (n,) non-negative eigenvalues
    :return: effective rank in [1, n], or 0.0 for the zero matrix
    """
    lam = eigvals.detach().to(torch.float64).clamp_min(0.0)
    total = lam.sum()
    if total <= 0:
        return 0.0
    p = lam / total
    entropy = -torch.special.xlogy(p, p).sum()  # 0 log 0 = 0
    return float(torch.exp(entropy))


def effective_rank(m: Tensor) -> float:
    """Spectral-entropy effective rank of an SPSD matrix (docs/metrics.md): r_e(I_n) = n, rank one -> 1.

    :param m: (n, n) SPSD matrix (a Gram, an NTK, a covariance)
    """
    return effective_rank_from_eigvals(spsd_eigvals(m))


def condition_number(eigvals: Tensor, rel_floor: float = 0.0) -> float:
    """kappa = lambda_max / lambda_min over the eigenvalues above ``rel_floor * lambda_max``.

    Eigenvalues at or below the floor count as the matrix's null space (with ``rel_floor=0``, the
    exact zeros); a zero matrix gives ``inf``.

    :param eigvals: (n,) non-negative eigenvalues
    :param rel_floor: fraction of the largest eigenvalue below which an eigenvalue is treated as 0
    """
    lam = eigvals.detach().to(torch.float64)
    top = float(lam.max()) if lam.numel() else 0.0
    if top <= 0:
        return math.inf
    kept = lam[lam > rel_floor * top]
    low = float(kept.min()) if kept.numel() else 0.0
    return top / low if low > 0 else math.inf


def small_gram(phi: Tensor) -> Tensor:
    """Whichever of Phi^T Phi / N and Phi Phi^T / N is smaller; both share their nonzero spectrum.

    :param phi: (N, m) features
    :return: (min(N, m), min(N, m)) Gram
    """
    n, m = phi.shape
    phi = phi.detach().to(torch.float64)
    return (phi.T @ phi if m <= n else phi @ phi.T) / max(n, 1)
