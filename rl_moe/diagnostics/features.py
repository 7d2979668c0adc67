"""Representation metrics: r_e and kappa of A_last, feature norm, ReDo dormant ratios (docs/metrics.md)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from rl_moe.diagnostics.linalg import (
    condition_number,
    effective_rank_from_eigvals,
    small_gram,
    spsd_eigvals,
)
from rl_moe.maths import dormant_scores
from rl_moe.nn import MoEOutput

#: Eigenvalues below this fraction of the largest count as zero for kappa (Gram built in float64).
COND_FLOOR = 1e-10
#: ReDo threshold (Sokar et al. 2023); tau = 0 counts exactly silent units.
DORMANT_TAU = 0.025


def feature_metrics(output: MoEOutput, layer: int = -1, weighted: bool = True) -> dict[str, float]:
    """r_e(A_last), kappa(A_last) and the mean feature norm, from the smaller Gram (SPHERE §4.4; docs/metrics.md).

    A = Phi^T Phi / N with Phi the routing-weighted concatenated last-hidden expert features; the
    sample Gram Phi Phi^T / N has the same nonzero spectrum and is used when N < m. kappa is
    lambda_max / lambda_min over eigenvalues above ``COND_FLOOR * lambda_max``.

    :param output: the network output on the probe batch
    :param layer: hidden layer index (-1 = last)
    :param weighted: routing-weighted features (SPHERE's Phi) or unweighted
    """
    phi = output.phi(layer, weighted).detach()  # (N, m)
    eig = spsd_eigvals(small_gram(phi))
    return {
        "feature_rank": effective_rank_from_eigvals(eig),
        # Plasticine's effective rank: the entropy of the normalized singular values of Phi
        # (sigma_i = sqrt(N lambda_i); N cancels in the normalization), not of the Gram's eigenvalues.
        "feature_erank": effective_rank_from_eigvals(eig.sqrt()),
        "feature_cond": condition_number(eig, COND_FLOOR),
        "feature_norm": float(phi.to(torch.float64).norm(dim=1).mean()),
    }


def unit_scores(hidden: Tensor, expert_idx: Tensor, n_experts: int) -> tuple[Tensor, Tensor]:
    """ReDo scores (:func:`rl_moe.maths.dormant_scores`) per expert and unit, over the rows routed to it.

    :param hidden: (R, H) post-activation rows of one hidden layer
    :param expert_idx: (R,) expert of each row
    :return: scores (E, H) and a mask (E,) of experts that received at least one row
    """
    h = hidden.detach().abs().to(torch.float64)
    sums = h.new_zeros(n_experts, h.shape[1]).index_add_(0, expert_idx, h)  # (E, H)
    counts = torch.bincount(expert_idx, minlength=n_experts).to(h.dtype)  # (E,)
    seen = counts > 0
    mean_abs = sums / counts.clamp_min(1.0)[:, None]  # (E, H) E|h_u| per expert
    return dormant_scores(mean_abs), seen


def dormant_metrics(output: MoEOutput, taus: Iterable[float] = (DORMANT_TAU, 0.0)) -> dict[str, float]:
    """Dormant-unit ratios per hidden layer and overall (ReDo, Sokar et al. 2023, arXiv:2302.12902).

    Scores are computed per expert (a unit is one hidden neuron of one expert, normalised by the
    mean over the same expert's layer) from the probe rows routed to that expert; experts that
    receive no probe state are left out. A unit is dormant when s <= tau.

    :param output: network output on the probe batch
    :param taus: thresholds; keys are ``dormant_ratio`` for 0.025 and ``dormant_ratio_tau0`` for 0
    Units of an expert that received no probe state are not dormant in ReDo's sense (their score
    is undefined, not small); the share of such experts is ``idle_expert_fraction`` instead.

    :return: ``dormant_ratio[_tau<t>]`` overall and ``..._l<layer>`` per hidden layer,
        ``idle_expert_fraction``: experts (over every expert stack) routed no probe state, and
        ``active_units``: the share of units active (score > 0) on some routed probe state, as the
        Plasticine benchmark reports it (1 - ``dormant_ratio_tau0`` when 0 is among ``taus``)
    """
    out: dict[str, float] = {}
    n_layers = len(output.groups[0].expert.hidden)
    per_layer = []
    idle = total_experts = 0
    for layer in range(n_layers):
        scores = []
        for group in output.groups:
            s, seen = unit_scores(group.expert.hidden[layer], group.dispatch.expert_idx, group.dispatch.n_experts)
            scores.append(s[seen].reshape(-1))
            if layer == 0:
                idle += int((~seen).sum())
                total_experts += seen.numel()
        per_layer.append(torch.cat(scores))
    out["idle_expert_fraction"] = idle / max(total_experts, 1)
    for tau in taus:
        key = "dormant_ratio" if tau == DORMANT_TAU else f"dormant_ratio_tau{tau:g}"
        dead = [(s <= tau).sum().item() for s in per_layer]
        total = [s.numel() for s in per_layer]
        for layer, (d, t) in enumerate(zip(dead, total)):
            out[f"{key}_l{layer}"] = d / t if t else 0.0
        out[key] = sum(dead) / max(sum(total), 1)
        if tau == 0.0:
            out["active_units"] = 1.0 - out[key]
    return out
