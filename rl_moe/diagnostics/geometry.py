"""Weight geometry: mean squared overlap (geometric regularization, Eq. 2) and frame potential /
coherence against the Welch bounds (DSC, Eq. 11)."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor


class FrameStats(NamedTuple):
    """Frame statistics of n unit vectors in R^d."""

    potential: float  # sum_{i != j} (u_i . u_j)^2
    potential_bound: float  # Welch: max(0, n^2 / d - n)
    coherence: float  # max_{i != j} |u_i . u_j|
    coherence_bound: float  # Welch: sqrt((n - d) / (d (n - 1))) for n > d, else 0


def unit_rows(vectors: Tensor) -> Tensor:
    """Rows flattened and scaled to unit norm: (n, ...) -> (n, d) float64."""
    flat = vectors.detach().reshape(vectors.shape[0], -1).to(torch.float64)
    return flat / flat.norm(dim=1, keepdim=True).clamp_min(1e-300)


def mso(vectors: Tensor) -> float:
    """MSO = 2 / (n (n - 1)) sum_{i<j} <W~_i, W~_j>^2 over normalized flattened rows (Eq. 2).

    :param vectors: (n, ...) one entry per expert, e.g. stacked first-layer weights (E, in, out)
    """
    u = unit_rows(vectors)
    n = u.shape[0]
    if n < 2:
        return math.nan
    g = u @ u.T
    off = g.pow(2).sum() - g.diagonal().pow(2).sum()
    return float(off / (n * (n - 1)))


def frame_stats(vectors: Tensor) -> FrameStats:
    """Frame potential and coherence of the normalized rows with their Welch lower bounds (DSC Eq. 11).

    :param vectors: (n, ...) frame vectors (expert weights or gate rows)
    """
    u = unit_rows(vectors)
    n, d = u.shape
    g = u @ u.T
    off = g - torch.diag(g.diagonal())
    potential = float(off.pow(2).sum())
    coherence = float(off.abs().max()) if n > 1 else 0.0
    bound = max(0.0, n * n / d - n)
    coh_bound = math.sqrt((n - d) / (d * (n - 1))) if n > d else 0.0
    return FrameStats(potential, bound, coherence, coh_bound)


def geometry_metrics(expert_weights: list[Tensor], gate_rows: Tensor | None) -> dict[str, float]:
    """MSO and frame statistics of the experts (first layer, and all layers) and the gate rows.

    :param expert_weights: per linear layer, stacked (E, in, out) weights of the routed experts
    :param gate_rows: (E, G) learned router rows, or None
    """
    first = expert_weights[0]
    flat_all = torch.cat([w.detach().reshape(w.shape[0], -1) for w in expert_weights], dim=1)  # (E, P)
    out = {"mso_weight": mso(first), "mso_weight_all": mso(flat_all)}
    sets = {"experts": first}
    if gate_rows is not None:
        sets["gate"] = gate_rows
    for name, vecs in sets.items():
        fs = frame_stats(vecs)
        out[f"dsc_fp_{name}"] = fs.potential
        out[f"dsc_fp_welch_{name}"] = fs.potential_bound
        out[f"dsc_coherence_{name}"] = fs.coherence
        out[f"dsc_coherence_welch_{name}"] = fs.coherence_bound
    return out
