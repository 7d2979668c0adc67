"""SSMoE: the eigenvector (EV) router mixed with the learned gate (ssmoe-eigenvector-routers §3,
Eqs. 3-5 and App. C Algorithm 1), adapted to MLP experts.

Algorithm 1 builds, per expert i, a spectral embedding C_i from the eigenvectors of its Gram
matrices A_i = W1 W1^T and B_i = W2^T W2 most similar to the router embedding r_i, and routes with
P = alpha softmax(x W_EV) + (1 - alpha) softmax(s(x)), W_EV = [C_1 ... C_E]. Adaptation to our MLP
experts (the paper's two spaces coincide in a transformer; ours do not):

- Only the input-side Gram A_i = W1 W1^T (in x in, first expert layer) is used: B_i of the head lives
  in action space, where x W_EV is undefined.
- The gate is an MLP, so r_i is its linear pull-back to observation space (:func:`gate_directions`);
  the EV router is a constant for autograd (Algorithm 1 pre-computes it).
- C_i is the mean of the top-c eigenvectors by |cos| with r_i, each sign-aligned to r_i (an
  eigenvector's sign is arbitrary), as in :mod:`rl_moe.diagnostics.ssmoe`.
- Both softmaxes use the gate temperature; the top-K of P is selected and its weights renormalized
  on the selected set, so weights sum to one as for every router here (Algorithm 1 uses P_i
  unnormalized). With alpha = 0 the layer is exactly the Top-K router (the same function is
  called); with alpha = 1 the gate logits are ignored.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rl_moe.nn.activations import ACTIVATION_SPECS
from rl_moe.nn.gate import GateActivation
from rl_moe.nn.routing import Routing


def mean_selected(vecs: Tensor, scores: Tensor, ref: Tensor, c: int) -> Tensor:
    """Average of the c columns of ``vecs`` (E, d, d) with largest ``scores`` (E, d), each
    sign-aligned to ``ref`` (E, d) (Alg. 1: TopC then mean)."""
    idx = scores.topk(c, dim=1).indices  # (E, c)
    sel = torch.gather(vecs, 2, idx[:, None, :].expand(-1, vecs.shape[1], -1))  # (E, d, c)
    sign = torch.sign(torch.einsum("edc,ed->ec", sel, ref))
    sign = torch.where(sign == 0, torch.ones_like(sign), sign)
    return (sel * sign[:, None, :]).mean(2)  # (E, d)


def input_embeddings(first: Tensor, router_dirs: Tensor, c: int) -> Tensor:
    """EV-router weights W_EV^T (E, in) from the first-layer weights (E, in, H1) (Alg. 1, steps 1-3).

    :param first: (E, in, H1) first-layer expert weights (y = x W)
    :param router_dirs: (E, in) router embeddings r_i in input space
    :param c: eigenvectors averaged per expert (capped by ``in``)
    """
    a = first.detach().to(torch.float64)
    _, vecs = torch.linalg.eigh(a @ a.transpose(1, 2))  # (E, in, in), eigenvectors in columns
    r = router_dirs.detach().to(torch.float64)
    r = r / r.norm(dim=1, keepdim=True).clamp_min(1e-300)
    sim = torch.einsum("edk,ed->ek", vecs, r).abs()  # (E, in) |cos(v_k, r)|
    return mean_selected(vecs, sim, r, min(c, vecs.shape[1])).to(first.dtype)


def gate_directions(gate: torch.nn.Module) -> Tensor:
    """r_e (E, in): the MLP gate's rows pulled back to observation space through its linear maps,
    W_logits W_h ... W_1 (activations and LayerNorms dropped).

    The paper's router is linear, so r_e is a row of it. Ours is an MLP; its linear pull-back
    depends on the weights only, so a state's routing never depends on the batch it comes with
    (a batch-mean Jacobian would route a state differently when acting and when training, which
    would bias PPO's probability ratio).
    """
    rows = gate.logits.weight  # (E, G)
    for module in reversed(list(gate.body)):
        if isinstance(module, torch.nn.Linear):
            rows = rows @ module.weight  # (E, previous width)
        elif isinstance(module, GateActivation):
            rows = ACTIVATION_SPECS[module.name].pull_back(rows)  # (E, H): a widening one folds back
    return rows


def mixed_probs(logits: Tensor, ev_logits: Tensor, temperature: float, alpha: float) -> Tensor:
    """P = alpha softmax(f_EV / tau) + (1 - alpha) softmax(s / tau), (N, E) (SSMoE Eq. 5, Alg. 1).

    :param logits: (N, E) learned gate logits s(x)
    :param ev_logits: (N, E) EV-router logits f_EV(x) = x W_EV
    """
    mixed = alpha * torch.softmax(ev_logits / temperature, dim=1)
    if alpha < 1.0:  # at alpha = 1 the gate is not part of the graph at all
        mixed = mixed + (1.0 - alpha) * torch.softmax(logits / temperature, dim=1)
    return mixed


def ssmoe_routing(mixed: Tensor, k: int) -> Routing:
    """Top-K of the mixed probabilities (N, E), weights renormalized on the selected set."""
    top = mixed.topk(k, dim=1)  # (N, K)
    weights = top.values / top.values.sum(1, keepdim=True)
    probs = torch.zeros_like(mixed).scatter(1, top.indices, weights)
    mask = torch.zeros_like(mixed, dtype=torch.bool).scatter(1, top.indices, True)
    return Routing(probs, mask, top.indices)
