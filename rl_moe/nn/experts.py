"""Stacked expert MLPs run over only the rows routed to each expert.

Weights are stacked tensors (E, in, out): no per-expert modules on the hot path. A batch of routed
rows sorted by expert is multiplied segment by segment (:func:`segment_matmul`), so the cost is
proportional to the routed rows, not to N*E.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rl_moe.nn.activations import ACTIVATION_SPECS, feature_widths
from rl_moe.nn.heads import InjectedHeads

ACTIVATION_FNS = {name: spec.fn for name, spec in ACTIVATION_SPECS.items()}
#: Orthogonal init gains per activation (the SB3 / CleanRL convention uses sqrt(2) for ReLU).
ACTIVATION_GAINS = {name: spec.gain for name, spec in ACTIVATION_SPECS.items()}

# grouped_mm wins only once the Python loop over experts dominates (measured: slower at E=10,
# ~2x faster at E=160 on CPU); it needs 16-byte aligned strides.
_GROUPED_MM_MIN_EXPERTS = 32


def _grouped_mm_ok(x: Tensor, weight: Tensor) -> bool:
    return (
        hasattr(F, "grouped_mm")  # feature detection: torch builds without the grouped kernel
        and x.device.type == "cpu"
        and weight.shape[0] >= _GROUPED_MM_MIN_EXPERTS
        and x.dtype == torch.float32
        and x.shape[1] % 4 == 0
        and weight.shape[2] % 4 == 0
    )


def segment_matmul(x: Tensor, weight: Tensor, counts: tuple[int, ...], bias: Tensor | None = None) -> Tensor:
    """Row block e of ``x`` times ``weight[e]``, plus ``bias[e]`` when given.

    :param x: (R, in), rows sorted by expert, ``counts[e]`` rows for expert e
    :param weight: (E, in, out)
    :param counts: rows per expert
    :param bias: (E, out) or None. Added per block (one ``addmm`` each): gathering a per-row bias
        with the expert index instead costs a scatter-add in backward (Top-K actor forward +
        backward went from 3.62x to 2.97x the dense MLP, ``benchmarks/moe_throughput.py``)
    :return: (R, out)
    """
    if len(counts) == 1:
        return x @ weight[0] if bias is None else torch.addmm(bias[0], x, weight[0])
    if _grouped_mm_ok(x, weight):
        rows = torch.tensor(counts, device=x.device)
        out = F.grouped_mm(x.contiguous(), weight, offs=rows.cumsum(0).to(torch.int32))
        if bias is None:
            return out
        return out + bias.repeat_interleave(rows, dim=0, output_size=x.shape[0])
    if not torch.is_grad_enabled():
        return _active_segments(x, weight, counts, bias)
    # split/unbind keep backward to one stack per weight; indexing weight[e] would allocate E
    # full-size zero gradients.
    biases = bias.unbind(0) if bias is not None else (None,) * len(counts)
    blocks = [
        xb @ w if b is None else torch.addmm(b, xb, w)
        for xb, w, b, c in zip(torch.split(x, counts), weight.unbind(0), biases, counts)
        if c
    ]
    return _joined(blocks, x, weight)


def _joined(blocks: list[Tensor], x: Tensor, weight: Tensor) -> Tensor:
    """The row blocks of the active experts, in expert order, as one (R, out) tensor."""
    if not blocks:
        return x.new_zeros(0, weight.shape[2])
    return torch.cat(blocks) if len(blocks) > 1 else blocks[0]


def _active_segments(x: Tensor, weight: Tensor, counts: tuple[int, ...], bias: Tensor | None) -> Tensor:
    """:func:`segment_matmul` without autograd (acting, evaluation, probes): views of the active
    experts only. The same ``addmm`` on the same views as the split/unbind path, so bit-identical;
    with routing on 2 of 10 experts a layer makes 6 views instead of 30."""
    blocks = []
    start = 0
    for e, c in enumerate(counts):
        if c:
            xb, w = x.narrow(0, start, c), weight[e]
            blocks.append(xb @ w if bias is None else torch.addmm(bias[e], xb, w))
            start += c
    return _joined(blocks, x, weight)


def _per_expert(param: Tensor, expert_idx: Tensor | None) -> Tensor:
    """(E, D) -> per-row (R, D), or the single expert's (D,) when E == 1."""
    return param[0] if expert_idx is None else param[expert_idx]


class ExpertPass(NamedTuple):
    """Per-row results of running the experts."""

    out: Tensor  # (R, out) head output, before routing weights
    hidden: tuple[Tensor, ...]  # per hidden layer, (R, w H_l) post-activation features (w = 2 for crelu, fourier)
    pre: tuple[Tensor, ...]  # per hidden layer, (R, H_l) activation inputs (after LayerNorm if any)
    inputs: tuple[Tensor, ...]  # per linear layer incl. head, (R, in_l) its input a_l
    linear: tuple[Tensor, ...]  # per linear layer incl. head, (R, out_l) its output z_l = a_l W + b
    normed: tuple[Tensor, ...]  # per hidden layer with LayerNorm, (R, H_l) normalized z before affine


class StackedExperts(nn.Module):
    """E independent MLPs ``in -> hidden... -> out`` with stacked parameters.

    :param n_experts: E
    :param in_dim: input width
    :param hidden: hidden widths
    :param out_dim: head width (action dim for actors, 1 for critics)
    :param activation: a key of :data:`~rl_moe.nn.activations.ACTIVATION_SPECS`; ``crelu`` and
        ``fourier`` double each hidden layer's features, so the next layer takes 2 H_l inputs
    :param layer_norm: per-expert LayerNorm (with per-expert affine) after each hidden linear
    :param out_gain: orthogonal init gain of the heads (0.01 for policy means, 1 for values)
    """

    def __init__(
        self,
        n_experts: int,
        in_dim: int,
        hidden: tuple[int, ...],
        out_dim: int,
        activation: str = "relu",
        layer_norm: bool = False,
        out_gain: float = 1.0,
    ) -> None:
        super().__init__()
        self.n_experts = n_experts
        self.in_dim, self.out_dim, self.hidden_dims = in_dim, out_dim, tuple(hidden)
        self.activation = activation
        self.layer_norm = layer_norm
        ins, outs = (in_dim, *feature_widths(self.hidden_dims, activation)), (*hidden, out_dim)
        self.weights = nn.ParameterList(nn.Parameter(torch.empty(n_experts, a, b)) for a, b in zip(ins, outs))
        self.biases = nn.ParameterList(nn.Parameter(torch.zeros(n_experts, b)) for b in outs)
        if layer_norm:
            self.ln_weights = nn.ParameterList(nn.Parameter(torch.ones(n_experts, h)) for h in hidden)
            self.ln_biases = nn.ParameterList(nn.Parameter(torch.zeros(n_experts, h)) for h in hidden)
        self.out_gain = out_gain
        self.injected = InjectedHeads()  # plasticity injection's heads (rl_moe.nn.inject); none by default
        gains = [ACTIVATION_GAINS[activation]] * len(hidden) + [out_gain]
        with torch.no_grad():
            for w, gain in zip(self.weights, gains):
                for e in range(n_experts):
                    nn.init.orthogonal_(w[e], gain=gain)

    def layer_weights(self) -> list[Tensor]:
        """The (E, in, out) weight of each linear layer as the forward pass uses it (subclasses
        such as SD-MoE's :class:`~rl_moe.nn.sdmoe.SpectralExperts` compose it from parts)."""
        return list(self.weights)

    @property
    def n_layers(self) -> int:
        """Number of linear layers, the head included."""
        return len(self.weights)

    def forward(self, x: Tensor, counts: tuple[int, ...], expert_idx: Tensor | None) -> ExpertPass:
        """Run the rows of ``x`` through their experts.

        :param x: (R, in) rows sorted by expert
        :param counts: rows per expert
        :param expert_idx: (R,) expert of each row, or None when E == 1
        """
        act = ACTIVATION_FNS[self.activation]
        hidden: list[Tensor] = []
        pre: list[Tensor] = []
        inputs: list[Tensor] = []
        linear: list[Tensor] = []
        normed: list[Tensor] = []
        ws, bs = self.layer_weights(), list(self.biases)  # ParameterList indexing is slow Python
        h = x
        for layer in range(len(self.hidden_dims)):
            inputs.append(h)
            z = segment_matmul(h, ws[layer], counts, bs[layer])
            linear.append(z)
            if self.layer_norm:
                n = F.layer_norm(z, z.shape[-1:])
                normed.append(n)
                z = n * _per_expert(self.ln_weights[layer], expert_idx) + _per_expert(self.ln_biases[layer], expert_idx)
            pre.append(z)
            h = act(z)
            hidden.append(h)
        inputs.append(h)
        out = segment_matmul(h, ws[-1], counts, bs[-1])
        if len(self.injected):
            out = self.injected.add(out, lambda w, b: segment_matmul(h, w, counts, b))
        linear.append(out)
        return ExpertPass(out, tuple(hidden), tuple(pre), tuple(inputs), tuple(linear), tuple(normed))

    def forward_all(self, x: Tensor) -> ExpertPass:
        """Every expert on every row, with batched matmuls (the static-shape layout).

        :param x: (N, in) rows shared by all experts, or (E, N, in) one slab per expert
        :return: an :class:`ExpertPass` whose rows are expert-major, R = E * N
        """
        act = ACTIVATION_FNS[self.activation]
        e = self.n_experts
        ws = self.layer_weights()
        hidden: list[Tensor] = []
        pre: list[Tensor] = []
        inputs: list[Tensor] = []
        linear: list[Tensor] = []
        normed: list[Tensor] = []
        h = x if x.dim() == 3 else x.expand(e, *x.shape)  # (E, N, in), a view
        n = h.shape[1]

        def record(t: Tensor, into: list[Tensor]) -> Tensor:
            # Keep the (E*N, D) tensor on the forward path, so gradients taken with respect to
            # it (the eNTK, SPHERE's gradient Gram) see everything downstream.
            flat = t.reshape(e * n, t.shape[-1])
            into.append(flat)
            return flat.view(e, n, -1)

        for layer in range(len(self.hidden_dims)):
            inputs.append(h.reshape(e * n, h.shape[-1]))
            z = record(torch.baddbmm(self.biases[layer][:, None, :], h, ws[layer]), linear)  # (E, N, H)
            if self.layer_norm:
                nz = record(F.layer_norm(z, z.shape[-1:]), normed)
                z = nz * self.ln_weights[layer][:, None, :] + self.ln_biases[layer][:, None, :]
            z = record(z, pre)
            h = record(act(z), hidden)
        inputs.append(hidden[-1])
        out = torch.baddbmm(self.biases[-1][:, None, :], h, ws[-1])  # (E, N, D)
        record(self.injected.add_all(out, h) if len(self.injected) else out, linear)
        return ExpertPass(linear[-1], tuple(hidden), tuple(pre), tuple(inputs), tuple(linear), tuple(normed))
