"""Spectral utilities shared by every diagnostic: effective rank, condition number, smaller Gram.

The effective rank and the eigenvalues it is built on live in :mod:`rl_moe.maths` (shared with
SPHERE's logged rank) and are re-exported here.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rl_moe.maths import effective_rank, effective_rank_from_eigvals, spsd_eigvals

__all__ = ["condition_number", "effective_rank", "effective_rank_from_eigvals", "small_gram", "spsd_eigvals"]


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
