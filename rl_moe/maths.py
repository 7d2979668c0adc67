"""Maths shared by the regularizers, the learners and the diagnostics: one implementation each.

Effective rank (SPHERE Eq. 7), power iteration for top singular values, the ReDo dormant score and
the joint gradient norm. Pure torch, so that :mod:`rl_moe.regularizers` and
:mod:`rl_moe.diagnostics` can both import it without importing each other.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import torch
import torch.nn.functional as F
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

    No relative floor: -p log p -> 0 as p -> 0, so near-zero eigenvalues add near-zero entropy and
    r_e is continuous in the matrix; a floor would only add a threshold to tune. Negative round-off
    is clamped to 0 and exact zeros contribute nothing (0 log 0 = 0).

    :param eigvals: (n,) non-negative eigenvalues
    :return: effective rank in [1, n], or 0.0 for the zero matrix
    """
    lam = eigvals.detach().to(torch.float64).clamp_min(0.0)
    total = lam.sum()
    if total <= 0:
        return 0.0
    p = lam / total
    entropy = -torch.special.xlogy(p, p).sum()
    return float(torch.exp(entropy))


def effective_rank(m: Tensor) -> float:
    """Spectral-entropy effective rank of an SPSD matrix (docs/metrics.md): r_e(I_n) = n, rank one -> 1.

    :param m: (n, n) SPSD matrix (a Gram, an NTK, a covariance)
    """
    return effective_rank_from_eigvals(spsd_eigvals(m))


class SingularPair(NamedTuple):
    """Estimates of the top left and right singular vectors of a stack of matrices (E, a, b)."""

    u: Tensor  # (E, a) unit left vectors
    v: Tensor  # (E, b) unit right vectors


@torch.no_grad()
def power_iteration(w: Tensor, pair: SingularPair, steps: int, eps: float = 1e-12) -> SingularPair:
    """``steps`` rounds of u <- W v / ||W v||, v <- W^T u / ||W^T u|| for every matrix of ``w``.

    The scheme of torch's ``spectral_norm`` (Miyato et al. 2018), batched over E.

    :param w: (E, a, b) matrices
    :param pair: the current vectors (``u`` is overwritten by the first round)
    :param steps: rounds; 0 returns ``pair``
    :param eps: norm floor of the normalisation
    """
    u, v = pair
    for _ in range(steps):
        u = F.normalize(torch.bmm(w, v[:, :, None])[..., 0], dim=1, eps=eps)  # (E, a)
        v = F.normalize(torch.bmm(w.transpose(1, 2), u[:, :, None])[..., 0], dim=1, eps=eps)  # (E, b)
    return SingularPair(u, v)


def top_singular_value(w: Tensor, pair: SingularPair) -> Tensor:
    """(E,) sigma_max estimates u^T W v, differentiable in ``w`` (gradient u v^T with u, v fixed).

    :param w: (E, a, b) matrices
    :param pair: vectors from :func:`power_iteration`
    """
    return torch.einsum("ea,eab,eb->e", pair.u, w, pair.v)


def dormant_scores(mean_abs: Tensor) -> Tensor:
    """ReDo scores s_i = E|h_i| / (1/H sum_j E|h_j|) per layer (Sokar et al. 2023, arXiv:2302.12902, Eq. 1).

    A layer whose units are all silent scores 0 everywhere (every unit dormant), as the paper's
    code does with its small denominator offset; whether a layer was seen at all (an expert with no
    routed rows) is the caller's mask.

    :param mean_abs: (..., H) E|h_i| of every unit, the last dim one layer
    :return: (..., H) scores, mean 1 over a layer that is not silent
    """
    layer_mean = mean_abs.mean(dim=-1, keepdim=True)  # (..., 1)
    scores = mean_abs / layer_mean.clamp_min(torch.finfo(mean_abs.dtype).tiny)
    return torch.where(layer_mean > 0, scores, torch.zeros_like(scores))


def grads_norm(grads: Iterable[Tensor | None]) -> Tensor:
    """Joint L2 norm of a list of gradients (``None`` entries count as zero), as a 0-dim tensor.

    No host sync: the learner uses it on the device; callers that log it convert with ``float``.
    """
    # Per-tensor norms first: no squared copy of large (E, in, out) expert gradients.
    norms = [torch.linalg.vector_norm(g) for g in grads if g is not None]
    return torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros(())
