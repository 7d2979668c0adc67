"""The heads plasticity injection adds to an expert stack (:mod:`rl_moe.nn.inject`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn


class InjectedHeads(nn.Module):
    """The heads injected into one expert stack; empty (no parameters, no cost) until the first
    injection. ``heads_*[i]``: the i-th fresh head (trainable while it is the newest);
    ``start_*[i]``: its frozen copy."""

    def __init__(self) -> None:
        super().__init__()
        self.heads_w, self.heads_b = nn.ParameterList(), nn.ParameterList()
        self.start_w, self.start_b = nn.ParameterList(), nn.ParameterList()

    def __len__(self) -> int:
        return len(self.heads_w)

    def add(self, out: Tensor, head: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
        """``out`` (R, D) plus every injected head's difference; ``head(weight, bias)`` runs one
        head on the routed rows, as the stack runs its own."""
        for w, b, w0, b0 in zip(self.heads_w, self.heads_b, self.start_w, self.start_b):
            out = out + (head(w, b) - head(w0, b0))
        return out

    def add_all(self, out: Tensor, h: Tensor) -> Tensor:
        """:meth:`add` in the static layout: ``out`` (E, N, D), ``h`` (E, N, H)."""
        for w, b, w0, b0 in zip(self.heads_w, self.heads_b, self.start_w, self.start_b):
            out = out + (torch.baddbmm(b[:, None, :], h, w) - torch.baddbmm(b0[:, None, :], h, w0))
        return out

    def grow(self, weight: Tensor, bias: Tensor) -> None:
        """Freeze the newest head and add ``(weight, bias)`` (E, H, D), (E, D) as a trainable head
        with a frozen copy."""
        for p in (*self.heads_w, *self.heads_b):
            p.requires_grad_(False)
        self.heads_w.append(nn.Parameter(weight.clone()))
        self.heads_b.append(nn.Parameter(bias.clone()))
        self.start_w.append(nn.Parameter(weight.clone(), requires_grad=False))
        self.start_b.append(nn.Parameter(bias.clone(), requires_grad=False))
