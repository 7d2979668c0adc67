"""SD-MoE: experts split into a shared low-rank spectral part and unique parts in its complement.

Following SD-MoE (sd-moe-spectral-decomposition, §3.2-3.3 and App. C), every expert linear layer
is the *proxy* matrix W^(i) = W_c + W_u^(i) (Eq. 8): one common matrix W_c shared by the E experts
of the stack, initialised at rank k (Eq. 6), and a unique matrix per expert initialised in the
orthogonal complement of W_c's singular subspaces (Eq. 7, App. C Algorithm 1). In the backward
pass the proxy gradient G^(i) is split (Eqs. 9-10): the part touching the shared subspaces goes to
W_c (summed over experts), the double-complement part to W_u^(i). The bases are refreshed from an
SVD of W_c every ``svd_every`` updates by :class:`rl_moe.regularizers.sdmoe.SDRefresh`.

Orientation: the paper's W is (out, in) with y = W x; ours is stored (in, out) with y = x W, so
the paper's U_k (output side) is our ``basis_out`` and its V_k (input side) our ``basis_in``. With
P_in = A A^T, P_out = B B^T, Eq. 9 reads G_c = G P_out + P_in G (I - P_out) in our storage, and
Eq. 10 leaves G_u = (I - P_in) G (I - P_out).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from rl_moe.nn.config import NetConfig
from rl_moe.nn.experts import StackedExperts
from rl_moe.nn.reuse import ScopedValue


def shared_rank(in_dim: int, out_dim: int, fraction: float) -> int:
    """k = ``fraction`` of min(in, out) (SD-MoE's "top 1%"), at least 1; 0 for a layer with
    min(in, out) = 1 (a critic head), where a rank-1 shared part would leave no unique part."""
    m = min(in_dim, out_dim)
    return 0 if m <= 1 else min(m - 1, max(1, round(fraction * m)))


def _complement_basis(basis: Tensor, width: int) -> Tensor:
    """Random orthonormal (d, width) columns orthogonal to ``basis`` (d, k) (App. C, Alg. 1 steps 2-4)."""
    d = basis.shape[0]
    z = torch.randn(d, width, dtype=torch.float64)
    b = basis.to(torch.float64)
    z = z - b @ (b.T @ z)  # project onto col(basis)^perp
    q, _ = torch.linalg.qr(z)
    return q - b @ (b.T @ q)  # a second projection removes the round-off QR reintroduces


class _SpectralSplit(torch.autograd.Function):
    """Forward W^(i) = W_c + W_u^(i) (Eq. 8); backward splits the proxy gradient (Eqs. 9-10)."""

    generate_vmap_rule = True  # usable under torch.func transforms (per-sample Jacobians)

    @staticmethod
    def forward(common: Tensor, unique: Tensor, basis_in: Tensor, basis_out: Tensor) -> Tensor:
        return common + unique  # (E, in, out)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor, ...], output: Tensor) -> None:
        ctx.save_for_backward(inputs[2], inputs[3])

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None, None]:
        a, b = ctx.saved_tensors  # (in, k), (out, k)
        g_u = grad - a @ (a.T @ grad)  # (I - P_in) G, (E, in, out)
        g_u = g_u - (g_u @ b) @ b.T  # ... (I - P_out)
        g_c = (grad - g_u).sum(0)  # (in, out): every expert's shared-subspace part
        return g_c, g_u, None, None


class SpectralExperts(StackedExperts):
    """:class:`StackedExperts` whose layer weights are ``common[l] + unique[l][e]`` (SD-MoE Eq. 8).

    ``weights`` returns the composed proxy matrices (E, in, out), so diagnostics and weight
    regularizers read what the forward pass uses; the trainable parameters are ``common``
    (in, out) and ``unique`` (E, in, out). Buffers ``basis_in_<l>`` (in, k) and ``basis_out_<l>``
    (out, k) hold W_c's top-k singular vectors; they travel with the checkpoint.

    The positional and other keyword parameters are those of :class:`StackedExperts`.

    :param rank_fraction: k as a fraction of min(in, out) (paper: 1%), at least 1
    """

    def __init__(self, *args: Any, rank_fraction: float = 0.01, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reused: ScopedValue[list[Tensor]] = ScopedValue()
        dense = list(self._modules.pop("weights"))  # orthogonal draws: their spectra seed Eq. 6
        self.common = nn.ParameterList()
        self.unique = nn.ParameterList()
        self.ranks: list[int] = []
        for layer, w in enumerate(dense):
            c, u, a, b = self._decompose(w.detach()[0], self.n_experts, rank_fraction)
            self.common.append(nn.Parameter(c))
            self.unique.append(nn.Parameter(u))
            self.register_buffer(f"basis_in_{layer}", a)
            self.register_buffer(f"basis_out_{layer}", b)
            self.ranks.append(a.shape[1])

    @staticmethod
    def _decompose(w: Tensor, n_experts: int, fraction: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """W_c = A_k S_k B_k^T (Eq. 6) and E unique parts U~ S_tail V~^T in the complement (Alg. 1)."""
        d_in, d_out = w.shape
        k = shared_rank(d_in, d_out, fraction)
        p, s, qh = torch.linalg.svd(w.to(torch.float64), full_matrices=False)
        a, b = p[:, :k], qh[:k].T  # (in, k), (out, k)
        common = (a * s[:k]) @ b.T
        tail = s[k:]  # long-tail singular values sigma_{k+1..min}
        units = []
        for _ in range(n_experts):
            u_t = _complement_basis(a, d_in - k)[:, : tail.numel()]  # (in, l)
            v_t = _complement_basis(b, d_out - k)[:, : tail.numel()]  # (out, l)
            units.append((u_t * tail) @ v_t.T)
        dtype = w.dtype
        return common.to(dtype), torch.stack(units).to(dtype), a.to(dtype).contiguous(), b.to(dtype).contiguous()

    def bases(self, layer: int) -> tuple[Tensor, Tensor]:
        """(basis_in (in, k), basis_out (out, k)) of layer ``layer``."""
        return self.get_buffer(f"basis_in_{layer}"), self.get_buffer(f"basis_out_{layer}")

    def layer_weights(self) -> list[Tensor]:
        if torch.is_grad_enabled():  # through the split, whose backward is Eqs. 9-10
            return self._composed()
        # Without autograd W_c + W_u is a function of the parameters alone, so the calls of one
        # :func:`~rl_moe.nn.reuse.weights_fixed` scope (a rollout, an evaluation) share it: adding
        # every layer again on each call had cost about as much as the rest of a policy call at
        # batch 8 (benchmarks/README.md). A new list, so a caller may change the list itself.
        return list(self._reused.get(lambda: [*self.common, *self.unique, *self.buffers()], self._composed))

    def _composed(self) -> list[Tensor]:
        return [_SpectralSplit.apply(c, u, *self.bases(i)) for i, (c, u) in enumerate(zip(self.common, self.unique))]

    @property
    def weights(self) -> Any:  # type: ignore[override]
        # During StackedExperts.__init__ the plain ParameterList still exists.
        return self._modules["weights"] if "weights" in self._modules else self.layer_weights()

    @property
    def n_layers(self) -> int:
        return len(self.common)

    @torch.no_grad()
    def refresh_bases(self) -> None:
        """Recompute U_k, V_k from an SVD of W_c (§3.3, "we perform SVD on W_c periodically").

        Parameters are untouched, so the forward output is unchanged; only the gradient split of
        later updates changes.
        """
        for layer, (c, k) in enumerate(zip(self.common, self.ranks)):
            if k == 0:
                continue
            p, _, qh = torch.linalg.svd(c.to(torch.float64), full_matrices=False)
            a, b = self.bases(layer)
            a.copy_(p[:, :k].to(a.dtype))
            b.copy_(qh[:k].T.to(b.dtype))


def sdmoe_experts(n_experts: int, in_dim: int, out_dim: int, cfg: NetConfig, out_gain: float) -> SpectralExperts:
    """The SD-MoE expert stack of a network built from ``cfg``."""
    return SpectralExperts(
        n_experts, in_dim, cfg.hidden, out_dim, cfg.activation, cfg.layer_norm, out_gain, rank_fraction=cfg.sd_rank_fraction
    )
