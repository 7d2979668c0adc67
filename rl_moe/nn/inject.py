"""Plasticity injection on an expert stack's heads (Nikishin et al. 2023, arXiv:2305.15555).

Each expert's head is its last linear layer. An injection freezes every head the stack trains
(the original one, or the last injected one) and adds a fresh trainable head W' with a frozen
copy W'_0 of it: expert e then outputs

    y_e = head_e(a) + sum_i (a W'_i[e] + b'_i[e] - (a W'_{i,0}[e] + b'_{i,0}[e]))

summed in injection order. Both terms of the newest difference are the same computation on the
same values at the moment of injection, so the difference is exactly 0 and the output is
unchanged bit for bit. Gradients reach the torso through every head (only head parameters are
frozen), so the torso's gradient is unchanged at injection too.

A stack's injections live in its :class:`~rl_moe.nn.heads.InjectedHeads`; :func:`grow_to_state` rebuilds them from a
state dict's keys, so a fresh network loads a checkpoint of a grown one.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from rl_moe.nn.experts import StackedExperts


def fresh_head(stack: StackedExperts, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """A head drawn as the stack's was at construction: each expert's (H, D) matrix orthogonal
    with the stack's head gain, bias 0; drawn on the CPU from ``generator``."""
    w = stack.weights[-1]  # (E, H, D)
    fresh = torch.empty(w.shape, dtype=w.dtype)
    for e in range(w.shape[0]):
        nn.init.orthogonal_(fresh[e], gain=stack.out_gain, generator=generator)
    return fresh.to(w.device), torch.zeros_like(stack.biases[-1])


@torch.no_grad()
def inject(stack: StackedExperts, weight: Tensor, bias: Tensor) -> None:
    """Freeze the stack's current head and add the fresh head ``(weight, bias)`` minus its
    frozen copy (module docstring)."""
    stack.weights[-1].requires_grad_(False)
    stack.biases[-1].requires_grad_(False)
    stack.injected.grow(weight, bias)


def injected_stacks(module: nn.Module) -> dict[str, StackedExperts]:
    """Qualified name -> every expert stack inside ``module``."""
    return {name: m for name, m in module.named_modules() if isinstance(m, StackedExperts)}


def grow_to_state(module: nn.Module, state: Mapping[str, Tensor]) -> bool:
    """Inject into each expert stack of ``module`` until it has as many injected heads as
    ``state`` holds for it (values are left to the load that follows); whether any grew.

    :raises ValueError: if a stack has more injections than ``state``
    """
    grew = False
    for name, stack in injected_stacks(module).items():
        prefix = f"{name}.injected.heads_w." if name else "injected.heads_w."
        wanted = sum(1 for key in state if key.startswith(prefix))
        if wanted < len(stack.injected):
            raise ValueError(f"the state holds {wanted} injected heads for {name!r}, but the network has {len(stack.injected)}")
        while len(stack.injected) < wanted:
            inject(stack, torch.zeros_like(stack.weights[-1]), torch.zeros_like(stack.biases[-1]))
            grew = True
    return grew
