"""Spectral utilities shared by every diagnostic: effective rank, condition number, stable rank,
smaller Gram.

The effective rank and the eigenvalues it is built on live in :mod:`rl_moe.maths` (shared with
SPHERE's logged rank) and are re-exported here.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rl_moe.maths import effective_rank, effective_rank_from_eigvals, spsd_eigvals

__all__ = ["condition_number", "effective_rank", "effective_rank_from_eigvals", "small_gram", "spsd_eigvals", "stable_rank"]


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


def stable_rank(mats: Tensor) -> Tensor:
    """||W||_F^2 / ||W||_2^2 of each matrix: between 1 and rank(W), and 0 for a zero matrix.

    The plasticity literature's smooth rank of a weight matrix (Rudelson & Vershynin, 2007); it
    falls towards 1 as one direction comes to dominate the layer.

    :param mats: (..., m, n) matrices
    :return: (...) float64 stable ranks
    """
    w = mats.detach().to(torch.float64)
    frob2 = w.pow(2).sum((-2, -1))  # (...)
    spec2 = torch.linalg.matrix_norm(w, ord=2).pow(2)  # (...)
    return torch.where(spec2 > 0, frob2 / spec2.clamp_min(torch.finfo(torch.float64).tiny), torch.zeros_like(spec2))


def small_gram(phi: Tensor) -> Tensor:
    """Whichever of Phi^T Phi / N and Phi Phi^T / N is smaller; both share their nonzero spectrum.

    :param phi: (N, m) features
    :return: (min(N, m), min(N, m)) Gram
    """
    n, m = phi.shape
    phi = phi.detach().to(torch.float64)
    return (phi.T @ phi if m <= n else phi @ phi.T) / max(n, 1)
