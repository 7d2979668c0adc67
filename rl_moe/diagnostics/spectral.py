"""SD-MoE principal subspace similarity of expert weights and gradients, and gate alignment
(SD-MoE, Eqs. 2 and 4).

Expert weights are stored (E, in, out) with y = x W, i.e. the paper's W^(i) is our W^T. For a
layer reading the shared input space (the first layer reads the observation) the comparison basis
is the paper's right singular vectors V (our left ones); for a layer writing the shared output space
(the head writes the action) it is the paper's left singular vectors U (our right ones). Hidden
layers between experts are not compared: their unit bases are private to each expert (any
permutation of units is the same expert), so a subspace overlap there has no meaning.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

#: Fraction of the spectrum forming the dominant subspace (SD-MoE uses the top 1%, at least one).
TOP_FRACTION = 0.01
SIDES = ("in", "out")


def top_basis(mats: Tensor, side: str, fraction: float = TOP_FRACTION) -> Tensor:
    """Dominant singular directions of each expert matrix.

    :param mats: (E, in, out) stacked matrices in y = x W convention
    :param side: ``in`` (input-space directions) or ``out`` (output-space directions)
    :return: (E, in or out, k) orthonormal columns, k = max(1, floor(fraction * min(in, out)))
    """
    if side not in SIDES:
        raise ValueError(f"unknown side {side!r}; valid choices: {', '.join(SIDES)}")
    u, _, vh = torch.linalg.svd(mats.detach().to(torch.float64), full_matrices=False)
    k = max(1, math.floor(fraction * min(mats.shape[1], mats.shape[2])))
    return u[:, :, :k] if side == "in" else vh[:, :k, :].transpose(1, 2)


def principal_similarity(bases: Tensor) -> Tensor:
    """sim(i, j) = sigma_max(B_j^T B_i) for all expert pairs: (E, E) (SD-MoE Eq. 2)."""
    cross = torch.einsum("adk,bdl->abkl", bases, bases)  # (E, E, k, k)
    return torch.linalg.matrix_norm(cross, ord=2)


def mean_offdiag(sim: Tensor, keep: Tensor | None = None) -> float:
    """Mean of the off-diagonal entries, over experts in ``keep`` (E,) if given."""
    n = sim.shape[0]
    mask = ~torch.eye(n, dtype=torch.bool, device=sim.device)
    if keep is not None:
        mask &= keep[:, None] & keep[None, :]
    return float(sim[mask].mean()) if mask.any() else math.nan


def gate_input_directions(module: nn.Module, x: Tensor) -> Tensor:
    """Linearized gate rows in input space: r_e = E_x[d logit_e / d x], (E, in).

    The gate is an MLP, so its last-layer rows live in the gate-embedding space; their pull-back to
    the observation space is what can be compared with the experts' input-side directions.
    """
    x = x.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        logits = module(x).logits  # (N, E)
        n_e = logits.shape[1]
        basis = torch.eye(n_e, dtype=logits.dtype, device=logits.device)[:, None, :].expand(n_e, *logits.shape)
        (jac,) = torch.autograd.grad(logits, x, grad_outputs=basis, is_grads_batched=True)  # (E, N, in)
    return jac.mean(1).detach()


def _abs_cos(a: Tensor, b: Tensor) -> Tensor:
    a = a / a.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    b = b / b.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    return (a @ b.T).abs()


def sdmoe_metrics(
    weights: list[Tensor], grads: list[Tensor | None] | None = None, gate_dirs: Tensor | None = None
) -> dict[str, float]:
    """SD-MoE similarities for the first (input-side) and last (output-side) expert layers.

    :param weights: per linear layer, stacked (E, in, out) routed expert weights
    :param grads: matching gradients of the actor loss (None entries skipped)
    :param gate_dirs: (E, in) linearized gate rows, for the alignment with each expert's leading
        input-side singular direction (``sdmoe_gate_align``, own expert; ``..._other``, others)
    """
    out: dict[str, float] = {}
    ends = {"in": 0, "out": len(weights) - 1}
    for side, layer in ends.items():
        out[f"sdmoe_param_sim_{side}"] = mean_offdiag(principal_similarity(top_basis(weights[layer], side)))
        g = grads[layer] if grads is not None else None
        if g is not None:
            alive = g.detach().flatten(1).norm(dim=1) > 0  # experts with no routed state have no gradient
            out[f"sdmoe_grad_sim_{side}"] = mean_offdiag(principal_similarity(top_basis(g, side)), alive)
    if gate_dirs is not None:
        lead = top_basis(weights[0], "in", fraction=0.0)[:, :, 0]  # (E, in)
        cos = _abs_cos(gate_dirs.to(torch.float64), lead)
        out["sdmoe_gate_align"] = float(cos.diagonal().mean())
        out["sdmoe_gate_align_other"] = mean_offdiag(cos)
    return out
