"""The regularized backward pass: the one place where regularizer terms enter an update.

Every learner's gradient step (PPO's minibatch step in :mod:`rl_moe.algos.update`, TD3's critic and
actor steps) calls :func:`regularized_backward` between its loss and its gradient clipping.
An adaptive term (:class:`~rl_moe.regularizers.hooks.GradScale`, SPHERE App. A.3) costs one extra
backward of the penalty only: the reference loss's gradient is computed once, used both for its norm
and as the update.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn

from rl_moe.algos.common import TermSink
from rl_moe.maths import grads_norm
from rl_moe.regularizers.hooks import LossContext, Penalty, Regularizer, adaptive_coef, clamp_coef


def regularized_backward(
    regularizers: Sequence[Regularizer], ctx: LossContext, reference: Tensor, rest: Tensor, params: Iterable[nn.Parameter], sink: TermSink
) -> Tensor:
    """Backpropagate ``reference + rest + sum(coef * penalty)`` into ``.grad``; return the total.

    Every regularizer first observes ``ctx``, then returns its penalties. ``reference`` is the loss
    adaptive coefficients compare against (PPO: the actor loss; TD3: the phase's loss) and ``rest``
    the other base terms. Coefficients stay tensors, so nothing here reads the device unless
    ``sink`` does.
    """
    for reg in regularizers:
        reg.observe(ctx)
    scaled: list[Penalty] = []
    for reg in regularizers:
        for term in reg.penalty(ctx):
            if term.scale is not None and term.scale.rho != 0.0:
                scaled.append(term)
                continue
            coef = 0.0 if term.scale is not None else term.coef
            sink.add(term.name, term.loss, coef)
            # Skipping zero coefficients keeps rho=0 runs bit-identical to unregularized ones.
            if isinstance(coef, Tensor) or coef != 0.0:
                rest = rest + coef * term.loss
    if not scaled:
        total = reference + rest
        total.backward()
        return total.detach()
    return _backward_scaled(reference, rest, scaled, [p for p in params if p.requires_grad], sink)


def _backward_scaled(reference: Tensor, rest: Tensor, scaled: list[Penalty], params: list[nn.Parameter], sink: TermSink) -> Tensor:
    grads = list(torch.autograd.grad(reference, params, retain_graph=True, allow_unused=True))
    index = {id(p): i for i, p in enumerate(params)}
    total = reference.detach() + rest.detach()
    updates: list[tuple[Tensor, tuple[Tensor | None, ...]]] = []
    keep: list[tuple[Tensor, list[int]]] = []  # PCGrad: (share of the reference gradient removed, its indices)
    for term in scaled:  # every norm is taken before ``grads`` is updated in place below
        s = term.scale
        assert s is not None
        sel = [index[id(p)] for p in s.params if id(p) in index]
        pen = torch.autograd.grad(term.loss, params, retain_graph=True, allow_unused=True)
        if s.reference is reference:
            ref_norm = grads_norm(grads[i] for i in sel)
        else:
            ref_norm = grads_norm(torch.autograd.grad(s.reference, [params[i] for i in sel], retain_graph=True, allow_unused=True))
        coef = clamp_coef(adaptive_coef(s.rho, ref_norm, grads_norm(pen[i] for i in sel), s.eps, s.norm_eps), s.ceiling)  # () tensor
        if s.pcgrad and s.reference is reference:
            pairs = [(pen[i], grads[i]) for i in sel if pen[i] is not None and grads[i] is not None]
            dot = coef * sum(((a * b).sum() for a, b in pairs), start=coef.new_zeros(()))
            share = torch.where(dot < 0, dot / (ref_norm**2 + s.eps), torch.zeros_like(dot)).detach()
            keep.append((share, sel))
        if s.on_resolve is not None:
            s.on_resolve(coef)
        sink.add(term.name, term.loss, coef)
        updates.append((coef, pen))
        total = total + coef * term.loss.detach()
    # PCGrad: the penalty's opposing component along g_ref comes off as share * g_ref.
    for share, sel in keep:
        for i in sel:
            if grads[i] is not None:
                grads[i] = grads[i].mul(1.0 - share)
    # In place: with many experts these are the largest tensors of the update.
    for coef, pen in updates:
        for i, g in enumerate(pen):
            if g is not None:
                grads[i] = g.mul_(coef) if grads[i] is None else grads[i].addcmul_(g, coef)
    if rest.requires_grad:
        rest.backward()
    for p, g in zip(params, grads):
        if g is not None:
            p.grad = g if p.grad is None else p.grad.add_(g)
    return total
