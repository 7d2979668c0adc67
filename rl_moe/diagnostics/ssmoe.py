"""SSMoE eigenvector-router diagnostics (SSMoE §3.2, Eqs. 3-5 and Algorithm 1), adapted to MLP experts.

For expert i, A_i = W1 W1^T (first layer, observation space) and B_i = W_L^T W_L (head, action
space); with our (in, out) storage these are exactly the paper's FFN1 FFN1^T and FFN2^T FFN2.
The paper averages the top-c eigenvectors of both into one embedding because its two spaces
coincide (token space); ours differ, so we keep two embeddings:

- input side: the c eigenvectors of A_i most aligned (|cos|) with the expert's router embedding,
  sign-aligned to it and averaged. Our gate is an MLP, so the router embedding is its linearized
  row in observation space (:func:`rl_moe.diagnostics.spectral.gate_input_directions`). This
  embedding defines the EV router f_EV(x) = x W_EV (Eq. 5 with alpha = 1).
- output side: the span of the top-c eigenvectors of B_i by eigenvalue. No router embedding lives
  in action space to fix their signs, and eigenvectors are orthogonal, so any averaged vector
  would carry a sign picked by round-off; the subspace itself is sign-free.

Reported: mean pairwise |cos| between experts' input-side embeddings (EV-router collapse) next to
that of the learned gate rows; for the output side, the subspace analogue ||U_i^T U_j||_F / sqrt(c)
(the root-mean-square cosine of the principal angles, = |cos| for c = 1); and the top-K overlap
|S_EV(x) and S_gate(x)| / K of the two routers.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rl_moe.diagnostics.spectral import mean_offdiag


def _abs_cos_matrix(rows: Tensor) -> Tensor:
    unit = rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-300)
    return (unit @ unit.T).abs()


def _mean_selected(vecs: Tensor, scores: Tensor, ref: Tensor, c: int) -> Tensor:
    """Average of the c columns of ``vecs`` (E, d, d) with largest ``scores`` (E, d), each sign-aligned to ref (E, d)."""
    idx = scores.topk(c, dim=1).indices  # (E, c)
    sel = torch.gather(vecs, 2, idx[:, None, :].expand(-1, vecs.shape[1], -1))  # (E, d, c)
    sign = torch.sign(torch.einsum("edc,ed->ec", sel, ref))
    sign = torch.where(sign == 0, torch.ones_like(sign), sign)
    return (sel * sign[:, None, :]).mean(2)  # (E, d)


def subspace_similarity(bases: Tensor) -> Tensor:
    """(E, E) ||U_i^T U_j||_F / sqrt(c) for orthonormal bases (E, d, c): sign- and rotation-free."""
    overlap = torch.einsum("idc,jdk->ijck", bases, bases)  # (E, E, c, c)
    return overlap.pow(2).sum((2, 3)).div(bases.shape[2]).sqrt()


def ev_embeddings(first: Tensor, last: Tensor, router_dirs: Tensor, c: int = 2) -> tuple[Tensor, Tensor]:
    """Input-side embeddings (E, in) and output-side bases (E, out, c) (Alg. 1, steps 1-2).

    :param first: (E, in, H1) first-layer weights
    :param last: (E, H_L, out) head weights
    :param router_dirs: (E, in) router embeddings in input space
    :param c: eigenvectors averaged per side (capped by the dimension)
    """
    a = first.detach().to(torch.float64)
    b = last.detach().to(torch.float64)
    _, vec_a = torch.linalg.eigh(a @ a.transpose(1, 2))  # (E, in, in), columns
    _, vec_b = torch.linalg.eigh(b.transpose(1, 2) @ b)  # (E, out, out), ascending
    r = router_dirs.detach().to(torch.float64)
    r_unit = r / r.norm(dim=1, keepdim=True).clamp_min(1e-300)
    sim = torch.einsum("edk,ed->ek", vec_a, r_unit).abs()  # (E, in)
    emb_in = _mean_selected(vec_a, sim, r_unit, min(c, vec_a.shape[1]))
    basis_out = vec_b.flip(2)[:, :, : min(c, vec_b.shape[2])]  # (E, out, c), descending eigenvalue
    return emb_in, basis_out


def topk_overlap(scores_a: Tensor, scores_b: Tensor, k: int) -> float:
    """Mean |TopK(a) intersect TopK(b)| / k over states: (N, E) scores each."""
    e = scores_a.shape[1]
    k = min(k, e)
    ma = torch.zeros_like(scores_a, dtype=torch.bool).scatter(1, scores_a.topk(k, dim=1).indices, True)
    mb = torch.zeros_like(scores_b, dtype=torch.bool).scatter(1, scores_b.topk(k, dim=1).indices, True)
    return float((ma & mb).sum(1).to(torch.float64).mean() / k)


def ssmoe_metrics(
    first: Tensor, last: Tensor, router_dirs: Tensor, gate_rows: Tensor, x: Tensor, gate_logits: Tensor, k: int, c: int = 2
) -> dict[str, float]:
    """EV-router collapse vs the learned router, and top-K agreement of the two routers.

    :param first: (E, in, H1) first-layer expert weights
    :param last: (E, H_L, out) head weights
    :param router_dirs: (E, in) linearized gate rows in input space
    :param gate_rows: (E, G) learned gate rows
    :param x: (N, in) network inputs
    :param gate_logits: (N, E) learned gate logits on ``x``
    :param k: experts per state of the learned router
    :param c: eigenvectors per embedding
    """
    emb_in, basis_out = ev_embeddings(first, last, router_dirs, c)
    ev_logits = x.detach().to(torch.float64) @ emb_in.T  # (N, E), f_EV(x) = x W_EV
    return {
        "ssmoe_ev_cos_in": mean_offdiag(_abs_cos_matrix(emb_in)),
        "ssmoe_ev_cos_out": mean_offdiag(subspace_similarity(basis_out)),
        "ssmoe_gate_cos": mean_offdiag(_abs_cos_matrix(gate_rows.detach().to(torch.float64))),
        "ssmoe_topk_overlap": topk_overlap(ev_logits, gate_logits.detach().to(torch.float64), k),
    }
