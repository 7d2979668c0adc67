"""DSC: Dynamic Subspace Composition (dsc-dynamic-subspace-composition, §2 and Algorithm 2).

A DSC branch adds a state-dependent low-rank update to a linear layer, y = f(x) + x ΔW(z(x)),
with ΔW = sum_{j in I(x)} z_j u_j^T v_j composed from K rank-1 atoms of a shared basis bank
(Eqs. 1, 4). Routing follows Algorithm 2: LayerNorm'd input -> router logits clamped to
[-tau, tau] -> softplus -> top-K -> magnitude-gated simplex z = phi/(S+eps) * tanh(S) (Eq. 5) ->
factorized output ((x U_I^T) * z) V_I (Eq. 14), times a channel scale gamma (Case 2, Eq. 8).

Placement in an RL policy (the paper places one DSC layer in a transformer block): a dense trunk
with the experts' depth and width (3 x 256) carries a DSC branch on *every hidden linear layer*,
added before the activation. Atoms are rectangular (u in R^in, v in R^out) so the first layer,
obs -> 256, gets a branch too. The bank size M is solved so that the active parameters per state
(trunk + routers + LayerNorms + K atoms per branch + gamma) match the Top-K MoE's (gate + K full
experts) at the same E, K (:func:`dsc_layout`). The last branch's routing is what ``MoEOutput``
reports; the auxiliary losses (Eqs. 9, 11, 12 and the signal S for Eq. 10) are summed over branches.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rl_moe.nn.config import NetConfig
from rl_moe.nn.experts import ACTIVATION_FNS, ExpertPass, StackedExperts

from rl_moe.nn.moe import AuxLosses, DSCLosses, ExpertGroup, MoEOutput, expert_param_count, gate_param_count
from rl_moe.nn.parts import NetworkParts
from rl_moe.nn.routing import Dispatch

#: eps of Eq. 3 (atom normalization) and Eq. 5 (simplex division).
DSC_EPS = 1e-6


class DSCPass(NamedTuple):
    """One DSC branch on a batch."""

    out: Tensor  # (N, out) gamma * ((x U_I^T) * z) V_I
    logits: Tensor  # (N, M) clamped router logits r
    indices: Tensor  # (N, K) selected atoms I(x)
    coef: Tensor  # (N, K) z = phi / (S + eps) * tanh(S)
    signal: Tensor  # (N,) S = sum of the selected softplus scores
    routed: Tensor  # (N, in) LayerNorm(x), the routing input


def frame_potential(atoms: Tensor) -> Tensor:
    """sum_{i != j} (a_i . a_j)^2 over the rows of ``atoms`` (M, d) (DSC Eq. 11, one bank)."""
    gram = atoms @ atoms.mT  # (M, M)
    return gram.pow(2).sum() - gram.diagonal(dim1=-2, dim2=-1).pow(2).sum()


def dsc_balance_loss(logits: Tensor) -> Tensor:
    """M * sum_j P_j^2, P_j the batch-mean softmax of the router logits (DSC Eq. 9); 1 when uniform."""
    mean_prob = torch.softmax(logits, dim=1).mean(0)  # (M,)
    return logits.shape[1] * mean_prob.pow(2).sum()


def dsc_z_loss(logits: Tensor) -> Tensor:
    """mean_b (logsumexp_j r_bj)^2 (DSC Eq. 12, the logit range constraint)."""
    return torch.logsumexp(logits, dim=1).pow(2).mean()


class DSCBranch(nn.Module):
    """The dynamic part of one DSC layer, in -> out (Algorithm 2).

    :param in_dim: input width d_in
    :param out_dim: output width d_out
    :param n_atoms: bank size M
    :param top_k: atoms composed per state K
    :param clamp: router logit bound tau
    :param init_scale: initial value of every entry of gamma
    """

    def __init__(self, in_dim: int, out_dim: int, n_atoms: int, top_k: int, clamp: float, init_scale: float) -> None:
        super().__init__()
        self.top_k, self.clamp = min(top_k, n_atoms), clamp
        self.norm = nn.LayerNorm(in_dim)
        self.router = nn.Linear(in_dim, n_atoms, bias=False)  # W_r
        nn.init.normal_(self.router.weight, std=1.0 / math.sqrt(in_dim))
        self.u_raw = nn.Parameter(torch.randn(n_atoms, in_dim) / math.sqrt(in_dim))  # U^ (M, in)
        self.v_raw = nn.Parameter(torch.randn(n_atoms, out_dim) / math.sqrt(out_dim))  # V^ (M, out)
        self.scale = nn.Parameter(torch.full((out_dim,), float(init_scale)))  # gamma (Case 2)

    def atoms(self) -> tuple[Tensor, Tensor]:
        """(U (M, in), V (M, out)) projected onto the unit ball (Eq. 3)."""
        u = self.u_raw / self.u_raw.norm(dim=-1, keepdim=True).clamp_min(DSC_EPS)
        v = self.v_raw / self.v_raw.norm(dim=-1, keepdim=True).clamp_min(DSC_EPS)
        return u, v

    def forward(self, x: Tensor) -> DSCPass:
        routed = self.norm(x)  # (N, in)
        r = self.router(routed).clamp(-self.clamp, self.clamp)  # (N, M)
        phi, idx = F.softplus(r).topk(self.top_k, dim=1)  # (N, K)
        s = phi.sum(1)  # (N,)
        z = phi / (s[:, None] + DSC_EPS) * torch.tanh(s)[:, None]  # (N, K) simplex x magnitude
        u, v = self.atoms()
        # Eq. 14 through the whole bank: x U^T costs as much as the router, and two dense matmuls
        # beat gathering K atoms per state (N, K, d) by 2x forward + backward on CPU (N=256, M=270).
        # u.t() refuses per-state copies of the bank: the exact eNTK then takes its batched
        # per-sample path (1.2 GB at N=256) instead of N copies of it (20 GB).
        c_lat = (x @ u.t()).gather(1, idx)  # (N, K) x U_I^T
        coef = torch.zeros_like(r).scatter(1, idx, c_lat * z)  # (N, M), zero off I(x)
        y = (coef @ v) * self.scale  # (N, out)
        return DSCPass(y, r, idx, z, s, routed)


class DSCLayout(NamedTuple):
    """Sizes of a DSC network."""

    n_atoms: int  # M per branch
    active_params: int  # per state, DSC network
    topk_active_params: int  # per state, the Top-K MoE it is matched to


def _topk_active(in_dim: int, out_dim: int, cfg: NetConfig) -> int:
    expert = expert_param_count(in_dim, cfg.hidden, out_dim, cfg.layer_norm)
    return gate_param_count(in_dim, cfg.n_experts, cfg) + cfg.top_k * expert


def dsc_layout(in_dim: int, out_dim: int, cfg: NetConfig) -> DSCLayout:
    """M such that the DSC network's active parameters per state match the Top-K MoE's
    (gate + K experts) at the same E, K; ``cfg.dsc_atoms`` > 0 fixes M instead."""
    trunk = expert_param_count(in_dim, cfg.hidden, out_dim, cfg.layer_norm)
    ins, outs = (in_dim, *cfg.hidden[:-1]), cfg.hidden
    k = cfg.dsc_top_k
    fixed = sum(2 * a + k * (a + b) + b for a, b in zip(ins, outs))  # LayerNorm, K atoms, gamma
    per_atom = sum(ins)  # router columns
    target = _topk_active(in_dim, out_dim, cfg)
    m = cfg.dsc_atoms if cfg.dsc_atoms > 0 else max(k, round((target - trunk - fixed) / per_atom))
    return DSCLayout(m, trunk + fixed + m * per_atom, target)


class DSCNet(NetworkParts, nn.Module):
    """Dense trunk (the experts' depth and width) with a DSC branch on every hidden layer.

    ``MoEOutput`` reports the trunk as one expert of weight 1 (so SPHERE and the diagnostics see
    its features) and the last branch's routing: ``probs`` (N, M) the simplex direction phi/S on
    the selected atoms, ``indices`` (N, K), ``logits`` (N, M). ``aux.dsc`` holds the balance,
    frame and z terms summed over branches and ``signal`` (L,), each branch's batch
    mean S for the budget loss (Eq. 10), whose target mu belongs to the regularizer; a forward
    without autograd leaves it None (:func:`dsc_aux`).
    """

    def __init__(self, in_dim: int, out_dim: int, cfg: NetConfig, out_gain: float = 1.0) -> None:
        super().__init__()
        self.cfg, self.in_dim, self.out_dim = cfg, in_dim, out_dim
        self.layout = dsc_layout(in_dim, out_dim, cfg)
        self.n_experts = self.layout.n_atoms
        self.experts = StackedExperts(1, in_dim, cfg.hidden, out_dim, cfg.activation, cfg.layer_norm, out_gain)
        ins = (in_dim, *cfg.hidden[:-1])
        self.branches = nn.ModuleList(
            DSCBranch(a, b, self.layout.n_atoms, cfg.dsc_top_k, cfg.dsc_clamp, cfg.dsc_scale) for a, b in zip(ins, cfg.hidden)
        )

    def forward(self, x: Tensor) -> MoEOutput:
        act = ACTIVATION_FNS[self.cfg.activation]
        trunk, ws = self.experts, self.experts.layer_weights()
        hidden, pre, inputs, linear, normed, passes = [], [], [], [], [], []
        h = x
        for layer, branch in enumerate(self.branches):
            inputs.append(h)
            dyn = branch(h)
            passes.append(dyn)
            z = h @ ws[layer][0] + trunk.biases[layer][0] + dyn.out  # (N, H) f(x) + x dW(z)
            linear.append(z)
            if trunk.layer_norm:
                nz = F.layer_norm(z, z.shape[-1:])
                normed.append(nz)
                z = nz * trunk.ln_weights[layer][0] + trunk.ln_biases[layer][0]
            pre.append(z)
            h = act(z)
            hidden.append(h)
        inputs.append(h)
        out = h @ ws[-1][0] + trunk.biases[-1][0]  # (N, out)
        linear.append(out)
        n = x.shape[0]
        ones = x.new_ones(n)
        dispatch = Dispatch(torch.arange(n, device=x.device), x.new_zeros(n, dtype=torch.long), ones, (n,), n)
        group = ExpertGroup(dispatch, ExpertPass(out, tuple(hidden), tuple(pre), tuple(inputs), tuple(linear), tuple(normed)))
        last = passes[-1]
        direction = last.coef / torch.tanh(last.signal).clamp_min(DSC_EPS)[:, None]  # (N, K) phi/(S+eps)
        probs = torch.zeros_like(last.logits).scatter(1, last.indices, direction)
        aux = dsc_aux(self.branches, passes) if torch.is_grad_enabled() else AuxLosses()
        return MoEOutput(out, probs, last.indices, last.logits, last.routed, (group,), aux)


def dsc_aux(branches: nn.ModuleList, passes: list[DSCPass]) -> AuxLosses:
    """DSC's auxiliary losses summed over the branches, for a forward with autograd only.

    Only a training forward's regularizer (:class:`rl_moe.regularizers.dsc.DSCAux`) reads them, so
    acting, evaluation and the probes skip them, as :func:`rl_moe.nn.moe.balance_aux` skips the
    gate's load balance: the frame potential alone is an (M, M) Gram of every bank, larger than the
    network's own products at the rollout's batch of 8.
    """
    frame = sum(frame_potential(u) + frame_potential(v) for u, v in (b.atoms() for b in branches))
    return AuxLosses(dsc=DSCLosses(
        balance=sum(dsc_balance_loss(p.logits) for p in passes),
        frame=frame,
        z=sum(dsc_z_loss(p.logits) for p in passes),
        signal=torch.stack([p.signal.mean() for p in passes]),
    ))  # fmt: skip
