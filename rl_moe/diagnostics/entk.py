"""Exact empirical NTK of a network's summed output via the layerwise Gram identity (docs/metrics.md).

For g(x) = sum_d f_d(x) and J the (N, P) per-sample gradient of g, K = J J^T. A linear layer
z = a W + b contributes K_l[i, j] = (a_i . a_j + 1)(delta_i . delta_j) with delta = dg/dz, and a
LayerNorm affine (gamma, beta) contributes ((delta * n)_i . (delta * n)_j) + delta_i . delta_j with
n the normalized input. Because each state's output depends only on that state, one backward of
sum_i g(x_i) yields every delta_i, so K costs one forward, one backward and a few N x N Grams;
J is never formed (SPHERE paper appendix A.5, Eq. 4).

MoE experts: a row of a stacked expert layer is a (state, expert) pair; a layer of expert e only
sees the rows routed to e, so its Gram is accumulated block by block per expert and scattered to
the states of those rows. Routing weights sit inside delta. Expert choice: the selection couples
states of the batch but is piecewise constant; with the selection of the batch held fixed (it is
not differentiated), each output depends only on its own state, so the identity is exact for the
batch's routing. Parameters no rule covers (e.g. SoftMoE's bare ``slot_keys``) are replaced by
N per-state copies for the forward, so the same single backward returns their exact per-sample
gradients; if that substitution changes the output (the parameter's ops do not broadcast over
the batch), they get per-sample gradients from batched backward passes (``is_grads_batched``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rl_moe.nn import ExpertPass, MoEOutput, SpectralExperts, StackedExperts

ForwardFn = Callable[[Tensor], "Tensor | MoEOutput"]


class EntkGram(NamedTuple):
    """The exact eNTK and how it was obtained."""

    gram: Tensor  # (N, N) float64, K = J J^T
    n_params: int  # parameters (scalars) the Jacobian is taken over
    fallback_params: int  # of which handled by batched per-sample backward passes (slow path)
    expanded_params: int  # of which handled by per-state parameter copies (one backward)


class _Capture:
    """Forward hooks recording the inputs/outputs of the layers the identity decomposes."""

    def __init__(self, root: nn.Module) -> None:
        self.linear: dict[nn.Module, list[tuple[Tensor, Tensor]]] = {}
        self.stacked: dict[nn.Module, list[ExpertPass]] = {}
        self._handles = []
        for module in root.modules():
            if isinstance(module, (nn.Linear, nn.LayerNorm)):
                self._handles.append(module.register_forward_hook(self._record_linear))
            elif isinstance(module, StackedExperts):
                self._handles.append(module.register_forward_hook(self._record_stacked))

    def _record_linear(self, module: nn.Module, inputs: tuple, output: Tensor) -> None:
        self.linear.setdefault(module, []).append((inputs[0], output))

    def _record_stacked(self, module: nn.Module, inputs: tuple, output: ExpertPass) -> None:
        self.stacked.setdefault(module, []).append(output)

    def clear(self) -> None:
        self.linear.clear()
        self.stacked.clear()

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def _output_tensor(result: Tensor | MoEOutput) -> Tensor:
    return result.out if isinstance(result, MoEOutput) else result


def _layer_weight(module: StackedExperts, layer: int) -> Tensor:
    """The parameter standing for layer ``layer``'s weights. SD-MoE's proxy matrices W_c + W_u^(i)
    are composed, not parameters: its eNTK is that of the Top-K MoE it computes, with the proxy
    matrices as the parameters (SD-MoE Eq. 8), whenever its unique parts are in the set."""
    return module.unique[layer] if isinstance(module, SpectralExperts) else module.weights[layer]


def _stacked_gram(
    module: StackedExperts,
    sp: ExpertPass,
    sample_idx: Tensor,
    counts: tuple[int, ...],
    grads: dict[int, Tensor | None],
    in_set: Callable[[Tensor], bool],
    n: int,
) -> Tensor:
    """Per-expert Gram of one expert stack, scattered to the states of its rows: (N, N) float64.

    Blocks are c_e x c_e over the rows actually routed to e, so the cost is sum_e c_e^2 (about
    N^2 K^2 / E for Top-K), not E N^2.
    """
    k = torch.zeros(n, n, dtype=torch.float64, device=sample_idx.device)
    layers = []  # (a rows or None, delta rows, bias in set) per linear layer
    for layer in range(module.n_layers):
        delta = grads.get(id(sp.linear[layer]))
        if delta is not None:
            a = sp.inputs[layer].detach() if in_set(_layer_weight(module, layer)) else None
            layers.append((a, delta, in_set(module.biases[layer])))
    ln_terms = []  # (delta after the affine, normed or None, beta in set) per LayerNorm
    if module.layer_norm:
        for layer in range(len(module.hidden_dims)):
            delta = grads.get(id(sp.pre[layer]))
            if delta is not None:
                normed = sp.normed[layer].detach() if in_set(module.ln_weights[layer]) else None
                ln_terms.append((delta, normed, in_set(module.ln_biases[layer])))
    if not layers and not ln_terms:
        return k

    def split(rows: Tensor) -> tuple[Tensor, ...]:  # rows are sorted by expert
        return torch.split(rows, counts)

    layer_blocks = [(split(a) if a is not None else None, split(d), b) for a, d, b in layers]
    ln_blocks = [(split(d), split(nm) if nm is not None else None, b) for d, nm, b in ln_terms]
    for e, states in enumerate(split(sample_idx)):
        if states.numel() == 0:
            continue
        blk = None
        for a, d, bias in layer_blocks:
            dd = d[e] @ d[e].T  # (c, c)
            factor = a[e] @ a[e].T if a is not None else torch.zeros_like(dd)
            term = (factor + 1.0) * dd if bias else factor * dd
            blk = term if blk is None else blk + term
        for d, nm, beta in ln_blocks:
            if nm is not None:
                dn = d[e] * nm[e]
                blk = dn @ dn.T if blk is None else blk + dn @ dn.T
            if beta:
                blk = d[e] @ d[e].T if blk is None else blk + d[e] @ d[e].T
        # (state, expert) pairs are unique within a stack, so plain indexing assigns each pair once.
        k[states[:, None], states[None, :]] += blk.to(torch.float64)
    return k


def _linear_gram(module: nn.Module, a: Tensor, delta: Tensor, in_set: Callable[[Tensor], bool]) -> Tensor:
    """Gram of an nn.Linear or nn.LayerNorm applied row-wise to (N, d) inputs: (N, N)."""
    dd = delta @ delta.T  # (N, N)
    k = torch.zeros_like(dd)
    if isinstance(module, nn.Linear):
        if in_set(module.weight):
            k = k + (a @ a.T) * dd
        if module.bias is not None and in_set(module.bias):
            k = k + dd
        return k
    normed = F.layer_norm(a, module.normalized_shape, eps=module.eps)  # before the affine
    if module.weight is not None and in_set(module.weight):
        dn = delta * normed
        k = k + dn @ dn.T
    if module.bias is not None and in_set(module.bias):
        k = k + dd
    return k


def _per_sample_gram(g: Tensor, params: list[Tensor]) -> Tensor:
    """Exact J_p J_p^T for leftover parameters from one batched backward: (N, N) float64."""
    n = g.shape[0]
    eye = torch.eye(n, dtype=g.dtype, device=g.device)
    try:
        jac = torch.autograd.grad(g, params, grad_outputs=eye, retain_graph=True, is_grads_batched=True, allow_unused=True)
    except RuntimeError:  # an op without a batching rule: one backward per state
        rows = [torch.autograd.grad(g[i], params, retain_graph=True, allow_unused=True) for i in range(n)]
        jac = tuple(
            torch.stack([r[p] if r[p] is not None else torch.zeros_like(params[p]) for r in rows]) for p in range(len(params))
        )
    k = torch.zeros(n, n, dtype=torch.float64, device=g.device)
    for j in jac:
        if j is not None:
            flat = j.reshape(n, -1).to(torch.float64)  # (N, p)
            k += flat @ flat.T
    return k


_DECOMPOSED = (nn.Linear, nn.LayerNorm, StackedExperts)


def _bare_parameters(module: nn.Module, ids: set[int]) -> dict[str, Tensor]:
    """Parameters (by name) of ``ids`` that no module rule decomposes, e.g. SoftMoE's slot_keys."""
    owned = {id(p) for m in module.modules() if isinstance(m, _DECOMPOSED) for p in m.parameters()}
    return {name: p for name, p in module.named_parameters() if id(p) in ids and id(p) not in owned}


def _expanded_forward(
    module: nn.Module, x: Tensor, bare: dict[str, Tensor], ref: Tensor
) -> tuple[object, dict[int, Tensor]] | None:
    """Forward with each bare parameter replaced by N per-state copies (N, *shape).

    Copy i is only used by state i when the parameter's ops broadcast over the batch (as a matmul
    does), so one backward yields exact per-sample gradients. Returns None (and the caller falls
    back to batched backward passes) when the substituted forward differs from ``ref``, the plain
    forward's output.
    """
    n = x.shape[0]
    leaves = {name: p.detach().unsqueeze(0).expand(n, *p.shape).clone().requires_grad_(True) for name, p in bare.items()}
    try:
        with torch.enable_grad():
            result = torch.func.functional_call(module, leaves, (x,), strict=False)
        out = _output_tensor(result)
    except RuntimeError:
        return None
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    if out.shape != ref.shape or not torch.allclose(out.detach(), ref, rtol=1e-4, atol=1e-5 * scale + 1e-12):
        return None
    return result, {id(bare[name]): leaf for name, leaf in leaves.items()}


def entk_gram(
    module: nn.Module,
    x: Tensor,
    forward: ForwardFn | None = None,
    params: Sequence[Tensor] | None = None,
) -> EntkGram:
    """Exact eNTK K = J J^T of g(x) = sum_d f_d(x) without forming J (SPHERE Eq. 4, App. A.5).

    :param module: owner of the parameters (hooks are placed on its submodules)
    :param x: (N, in) states (already preprocessed features)
    :param forward: x -> Tensor (N, D) or :class:`~rl_moe.nn.MoEOutput`; default ``module(x)``
    :param params: parameters to differentiate; default all of ``module``'s trainable ones
    :return: :class:`EntkGram` with K (N, N) in float64
    """
    params = [p for p in (module.parameters() if params is None else params) if p.requires_grad]
    ids = {id(p) for p in params}

    def in_set(p: Tensor | None) -> bool:
        return p is not None and id(p) in ids

    bare = _bare_parameters(module, ids) if forward is None else {}
    result, expanded, capture = _recorded_forward(module, x, forward, bare)
    n = x.shape[0]
    g = _output_tensor(result).reshape(n, -1).sum(1)  # (N,)
    jobs = _GramJobs.plan(capture, result, expanded, n)
    leftovers = [p for p in params if id(p) not in jobs.covered]
    k = torch.zeros(n, n, dtype=torch.float64, device=x.device)
    if leftovers:
        k += _per_sample_gram(g, leftovers)
    if jobs.targets:
        jobs.add_gram(k, g, expanded, in_set)
    n_fallback = sum(p.numel() for p in leftovers)
    n_expanded = sum(bare[name].numel() for name in bare if id(bare[name]) in expanded)
    return EntkGram(k, sum(p.numel() for p in params), n_fallback, n_expanded)


def _recorded_forward(
    module: nn.Module, x: Tensor, forward: ForwardFn | None, bare: dict[str, Tensor]
) -> tuple[Any, dict[int, Tensor], "_Capture"]:
    """The forward whose layers' inputs and outputs are recorded: with the bare parameters
    expanded per state where that forward reproduces ``module(x)``, else the plain one."""
    expanded: dict[int, Tensor] = {}
    if bare:
        with torch.no_grad():
            ref = _output_tensor(module(x))
    capture = _Capture(module)
    try:
        found = _expanded_forward(module, x, bare, ref) if bare else None
        if found is not None:
            result, expanded = found
        else:
            capture.clear()  # drop the records of a rejected substituted forward
            with torch.enable_grad():
                result = (forward or module)(x)
    finally:
        capture.remove()
    return result, expanded, capture


@dataclass
class _GramJobs:
    """The pieces of K computed from one backward of g: expanded per-state parameters, stacked
    expert layers and plain linear layers (each a target whose gradient the backward returns)."""

    targets: list[Tensor]
    stacked: list[tuple[nn.Module, Any]]
    linear: list[tuple[nn.Module, Tensor, Tensor]]
    covered: set[int]

    @classmethod
    def plan(cls, capture: "_Capture", result: Any, expanded: dict[int, Tensor], n: int) -> "_GramJobs":
        jobs = cls(list(expanded.values()), [], [], set(expanded))
        groups = result.groups if isinstance(result, MoEOutput) else ()
        for mod, passes in capture.stacked.items():
            group = next((gr for gr in groups if len(passes) == 1 and gr.expert is passes[0]), None)
            if group is None:
                continue  # its parameters fall back to per-sample gradients
            sp = group.expert
            jobs.targets += [t for t in sp.linear if t.requires_grad]
            if mod.layer_norm:
                jobs.targets += [t for t in sp.pre if t.requires_grad]
            jobs.stacked.append((mod, group))
            jobs.covered |= {id(p) for p in mod.parameters()}
        for mod, calls in capture.linear.items():
            if len(calls) != 1:
                continue
            a, z = calls[0]
            if a.dim() != 2 or a.shape[0] != n or z.shape[0] != n or not z.requires_grad:
                continue
            if isinstance(mod, nn.LayerNorm) and len(mod.normalized_shape) != 1:
                continue
            jobs.targets.append(z)
            jobs.linear.append((mod, a.detach(), z))
            jobs.covered |= {id(p) for p in mod.parameters(recurse=False)}
        return jobs

    def add_gram(self, k: Tensor, g: Tensor, expanded: dict[int, Tensor], in_set: Callable[[Tensor | None], bool]) -> None:
        """Add their share of K into ``k`` (float64, in place, in the order the terms always had),
        from one backward of sum(g)."""
        n = k.shape[0]
        deltas = torch.autograd.grad(g.sum(), self.targets, allow_unused=True)
        grads = {id(t): d for t, d in zip(self.targets, deltas)}
        for leaf in expanded.values():
            per_sample = grads[id(leaf)]
            if per_sample is not None:
                flat = per_sample.reshape(n, -1).to(torch.float64)  # (N, p) exact per-state gradients
                k += flat @ flat.T
        for mod, group in self.stacked:
            d = group.dispatch
            k += _stacked_gram(mod, group.expert, d.sample_idx, d.counts, grads, in_set, n)
        for mod, a, z in self.linear:
            delta = grads[id(z)]
            if delta is not None:
                k += _linear_gram(mod, a, delta, in_set).to(torch.float64)
