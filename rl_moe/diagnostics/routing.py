"""Expert specialization and routing metrics (SPHERE appendix J.11; geometric regularization Eq. 3)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rl_moe.nn import ExpertGroup, MoEOutput


def routed_group(output: MoEOutput) -> ExpertGroup:
    """The routed expert stack (DS-MoE puts its shared stack first)."""
    return output.groups[-1]


def dense_rows(group: ExpertGroup, values: Tensor) -> tuple[Tensor, Tensor]:
    """Scatter per-row values (R, d) to (N, E, d) plus the (N, E) mask of routed pairs."""
    d = group.dispatch
    dense = values.new_zeros(d.n_samples, d.n_experts, values.shape[1])
    dense[d.sample_idx, d.expert_idx] = values
    mask = torch.zeros(d.n_samples, d.n_experts, dtype=torch.bool, device=values.device)
    mask[d.sample_idx, d.expert_idx] = True
    return dense, mask


def coselected_cosines(group: ExpertGroup, values: Tensor) -> tuple[Tensor, Tensor]:
    """Cosines between co-selected experts' vectors of each state.

    :param values: (R, d) per-row vectors (e.g. last-hidden features or expert outputs)
    :return: cos (N, E, E) and the mask (N, E, E) of pairs e != e' both selected for the state
    """
    dense, mask = dense_rows(group, values.detach().to(torch.float64))  # (N, E, d)
    unit = dense / dense.norm(dim=2, keepdim=True).clamp_min(1e-12)
    cos = unit @ unit.transpose(1, 2)  # (N, E, E)
    n_e = mask.shape[1]
    pairs = mask[:, :, None] & mask[:, None, :] & ~torch.eye(n_e, dtype=torch.bool, device=mask.device)
    return cos, pairs


def _per_state_pair_mean(values: Tensor, pairs: Tensor) -> float:
    """Mean over states (with >= 2 selected experts) of the mean over their pairs."""
    count = pairs.sum((1, 2))  # (N,)
    keep = count > 0
    if not keep.any():
        return math.nan
    per_state = (values * pairs).sum((1, 2))[keep] / count[keep]
    return float(per_state.mean())


def specialization_metrics(output: MoEOutput) -> dict[str, float]:
    """J.11 overlap/orthogonality of selected experts' last-hidden features, and activation MSO.

    overlap = mean |cos| over pairs of distinct selected experts of a state (then over states);
    orthogonality = mean (1 - |cos|). ``mso_act`` is geometric-regularization Eq. 3: the mean
    squared cosine between co-selected experts' outputs (head outputs, unweighted).
    """
    group = routed_group(output)
    cos, pairs = coselected_cosines(group, group.expert.hidden[-1])
    overlap = _per_state_pair_mean(cos.abs(), pairs)
    out_cos, out_pairs = coselected_cosines(group, group.expert.out)
    return {
        "overlap": overlap,
        "orthogonality": 1.0 - overlap,
        "mso_act": _per_state_pair_mean(out_cos.pow(2), out_pairs),
    }


def silhouette(points: Tensor, labels: Tensor) -> float:
    """Mean silhouette (Rousseeuw 1987) with Euclidean distance; singleton clusters score 0.

    :param points: (N, G)
    :param labels: (N,) integer cluster labels; needs at least two distinct labels
    """
    x = points.detach().to(torch.float64)
    dist = torch.cdist(x, x, compute_mode="donot_use_mm_for_euclid_dist")  # (N, N)
    uniq, lab = torch.unique(labels, return_inverse=True)
    if uniq.numel() < 2:
        return math.nan
    onehot = torch.nn.functional.one_hot(lab, uniq.numel()).to(x.dtype)  # (N, C)
    sizes = onehot.sum(0)  # (C,)
    sums = dist @ onehot  # (N, C) total distance to each cluster
    own = sizes[lab]  # (N,)
    a = sums.gather(1, lab[:, None])[:, 0] / (own - 1).clamp_min(1.0)
    other = (sums / sizes).masked_fill(onehot.bool(), math.inf)
    b = other.min(1).values
    s = (b - a) / torch.maximum(a, b).clamp_min(1e-300)
    s = torch.where(own > 1, s, torch.zeros_like(s))
    return float(s.mean())


def knn_jaccard(points: Tensor, mask: Tensor, k: int = 10) -> float:
    """Mean Jaccard overlap of selected-expert sets between each state and its k nearest
    neighbours in gate-embedding space (J.11 local routing consistency).

    :param points: (N, G) gate embeddings
    :param mask: (N, E) selected experts
    """
    n = points.shape[0]
    k = min(k, n - 1)
    if k < 1:
        return math.nan
    x = points.detach().to(torch.float64)
    dist = torch.cdist(x, x, compute_mode="donot_use_mm_for_euclid_dist").fill_diagonal_(math.inf)
    nbr = dist.topk(k, largest=False).indices  # (N, k)
    m = mask.to(torch.float64)
    inter = torch.einsum("ne,nke->nk", m, m[nbr])
    union = m.sum(1)[:, None] + m[nbr].sum(2) - inter
    return float((inter / union.clamp_min(1.0)).mean())


def load_metrics(mask: Tensor) -> dict[str, float]:
    """MaxVio, active-expert ratio, normalized routing entropy and per-expert load (J.11).

    :param mask: (N, E) selected experts; c_e = number of states that selected e
    """
    c = mask.to(torch.float64).sum(0)  # (E,)
    n_e = c.numel()
    c_bar = c.mean()
    p = c / c.sum().clamp_min(1.0)
    entropy = float(-torch.special.xlogy(p, p).sum() / math.log(n_e)) if n_e > 1 else 0.0
    out = {
        "max_vio": float(((c - c_bar).abs() / c_bar).max()) if c_bar > 0 else math.nan,
        "active_ratio": float((c > 0).to(torch.float64).mean()),
        "entropy": entropy,
    }
    out.update({f"load_e{e}": float(p[e]) for e in range(n_e)})
    return out


def routing_metrics(output: MoEOutput, knn: int = 10) -> dict[str, float]:
    """All J.11 metrics of a MoE output on the probe batch (``routing/`` tags)."""
    group = routed_group(output)
    _, mask = dense_rows(group, group.expert.out[:, :1])
    out = specialization_metrics(output)
    out.update(load_metrics(mask))
    emb = output.gate_embedding
    if emb.shape[1] > 0:
        top1 = output.probs.detach().argmax(1)
        out["silhouette"] = silhouette(emb, top1)
        out["knn_jaccard"] = knn_jaccard(emb, mask, knn)
    return out
