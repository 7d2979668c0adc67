"""Gram statistics of block-sparse MoE feature matrices (SPHERE paper, Eq. 26 and App. A.2).

Phi (N, m) is the routing-weighted concatenation of expert features; with Top-K routing each row
has only K non-zero blocks. SPHERE needs only ||A||_F^2 and tr(A) of A = Phi^T Phi / N, which equal
those of the sample Gram G = Phi Phi^T / N. G is built expert by expert over routed rows only,
G_ij = sum_e h_ie h_je <feat_e(x_i), feat_e(x_j)> (:mod:`rl_moe.regularizers.gram_kernels`); the
m x m feature Gram is used only when m <= N.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from rl_moe.regularizers.blocks import FeatureBlock
from rl_moe.regularizers.gram_kernels import _plan, sample_gram_stats

__all__ = [
    "GRAM_SPACES", "FeatureBlock", "GramStats", "dense_phi", "feature_dim", "feature_gram",
    "gram_stats", "per_expert_stats", "sample_gram_stats",
]  # fmt: skip

#: Where the Gram may be computed.
GRAM_SPACES: tuple[str, ...] = ("auto", "sample", "feature")


class GramStats(NamedTuple):
    """||A||_F^2 and tr(A) of A = Phi^T Phi / N (equal to those of G = Phi Phi^T / N)."""

    fro2: Tensor  # () differentiable
    trace: Tensor  # () differentiable
    dim: int  # m, columns of Phi
    n: int  # N, rows of Phi
    gram: Tensor  # the Gram actually built: (N, N) sample space or (m, m) feature space


def feature_dim(blocks: Sequence[FeatureBlock]) -> int:
    """m = sum over stacks of E * H."""
    return sum(b.dispatch.n_experts * b.feats.shape[1] for b in blocks)


def dense_phi(blocks: Sequence[FeatureBlock]) -> Tensor:
    """Phi (N, m) materialised; zero blocks for unselected experts."""
    cols = []
    for b in blocks:
        d, f = b.dispatch, b.scaled()  # f: (R, H)
        if d.static:  # expert-major, every pair present: a reshape
            dense = f.view(d.n_experts, d.n_samples, f.shape[1]).transpose(0, 1)
        else:
            dense = f.new_zeros(d.n_samples, d.n_experts, f.shape[1]).index_put((d.sample_idx, d.expert_idx), f)
        cols.append(dense.reshape(d.n_samples, -1))  # (N, E*H)
    return torch.cat(cols, dim=1)


def feature_gram(blocks: Sequence[FeatureBlock]) -> Tensor:
    """A = Phi^T Phi / N (m, m); only sensible when m <= N."""
    phi = dense_phi(blocks)  # (N, m)
    return phi.t() @ phi / phi.shape[0]


def gram_stats(blocks: Sequence[FeatureBlock], space: str = "auto") -> GramStats:
    """||A||_F^2 and tr(A) computed in the smaller space.

    :param blocks: feature blocks of every expert stack (same N)
    :param space: ``auto`` (feature space iff m <= N), ``sample`` or ``feature``
    """
    if space not in GRAM_SPACES:
        raise ValueError(f"unknown Gram space {space!r}; valid choices: {', '.join(GRAM_SPACES)}")
    m, n = feature_dim(blocks), blocks[0].dispatch.n_samples
    use_feature = space == "feature" or (space == "auto" and m <= n)
    if use_feature:
        gram = feature_gram(blocks)
    elif all(b.dispatch.static for b in blocks):
        # Static layout (GPU path): Phi is a reshape, and one (N, m) x (m, N) matmul beats the
        # per-expert kernels, which need the routed counts on the host.
        phi = dense_phi(blocks)  # (N, m)
        gram = phi @ phi.t() / n
    else:
        fro2, trace, gram = sample_gram_stats(blocks)
        return GramStats(fro2, trace, m, n, gram)
    return GramStats(gram.pow(2).sum(), gram.diagonal().sum(), m, n, gram)


def per_expert_stats(blocks: Sequence[FeatureBlock]) -> list[GramStats]:
    """Per-expert Grams A_e = F_e^T F_e / N (H, H), without cross-expert blocks.

    One :class:`GramStats` per stack whose ``fro2`` and ``trace`` are vectors over its active
    experts (idle experts have a zero Gram and add nothing); one padded bmm per bucket.
    """
    out = []
    for b in blocks:
        d, h = b.dispatch, b.feats.shape[1]
        if d.static:  # every expert's (N, N) Gram in one bmm; idle rows are scaled to zero
            f = b.scaled().view(d.n_experts, d.n_samples, h)  # (E, N, H)
            g = torch.bmm(f, f.transpose(1, 2)) / d.n_samples  # (E, N, N)
            out.append(GramStats(g.pow(2).sum((1, 2)), g.diagonal(dim1=1, dim2=2).sum(1), h, d.n_samples, g.new_zeros(0)))
            continue
        plan = _plan(d, h)
        p = b.feats.index_select(0, plan.rows)  # (T, H)
        valid = b.feats.new_zeros(plan.row_off[-1]).index_fill(0, plan.slot_of_row, 1.0)  # (T,) 0 on pads
        sp = valid if b.scale is None else b.scale.index_select(0, plan.rows) * valid  # (T,)
        fro2, trace = [], []
        for k, (n_b, cap) in enumerate(plan.shapes):
            r0, r1 = plan.row_off[k], plan.row_off[k + 1]
            rows, s_k = p[r0:r1].view(n_b, cap, h), sp[r0:r1].view(n_b, cap)
            g = torch.bmm(rows, rows.transpose(1, 2)) * (s_k[:, :, None] * s_k[:, None, :]) / d.n_samples  # (B, C, C)
            fro2.append(g.pow(2).sum((1, 2)))
            trace.append(g.diagonal(dim1=1, dim2=2).sum(1))
        out.append(GramStats(torch.cat(fro2), torch.cat(trace), h, d.n_samples, p.new_zeros(0)))
    return out
