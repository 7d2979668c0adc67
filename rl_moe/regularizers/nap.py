"""Normalize-and-Project (Lyle et al. 2024, "Normalization and effective learning rates in
reinforcement learning", NeurIPS, arXiv:2407.01800).

Normalization before each nonlinearity (the method's network is built with LayerNorm after every
hidden linear layer, :attr:`rl_moe.continual.methods.Method.layer_norm`), and after each optimizer
step every weight matrix W is projected back to its norm at initialization:
W <- W * ||W_0||_F / ||W||_F. With normalization the network's function does not depend on these
norms, so the projection only fixes the effective learning rate, which would otherwise decay as
the norms grow.

On a MoE the unit is one matrix of one expert (a stacked (E, in, out) weight is E matrices, each
kept at its own norm) and each linear layer of the gate.

Choices the paper leaves open or sets per domain: heads (the experts' output layers and the gate's
logits layer) are not projected by default (``heads``): no normalization follows them, and PPO's
mean head starts at gain 0.01, so fixing its norm would bound the policy's mean; biases and the
LayerNorm affines are left free; the norms are taken once, when training starts (before any
update), and kept for the whole run (not re-taken at task boundaries); Adam's moments are left as
they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from rl_moe.nn.experts import StackedExperts
from rl_moe.policies import policy_roles
from rl_moe.regularizers.targets import Targeted, active_roles, check_target, parameter_names


@dataclass(frozen=True)
class NaPConfig:
    """Normalize-and-Project settings.

    :param target: ``actor``, ``critic`` or ``both``
    :param heads: also project the output layers (expert heads, gate logits)
    """

    target: str = "actor"
    heads: bool = False

    def __post_init__(self) -> None:
        check_target(self.target)


def projected_weights(net: nn.Module, heads: bool) -> list[tuple[nn.Parameter, bool]]:
    """(weight, stacked) of every matrix NaP keeps at its norm in ``net``: stacked (E, in, out)
    expert weights (``stacked``, one norm per expert) and ``nn.Linear`` weights.

    Stacks that compose their weights from other parts (SD-MoE) are left out, as their parts are
    not weight matrices of the forward pass."""
    out: list[tuple[nn.Parameter, bool]] = []
    for name, module in net.named_modules():
        if type(module) is StackedExperts:
            ws = list(module.weights)
            out += [(w, True) for w in (ws if heads else ws[:-1])]
        elif isinstance(module, nn.Linear) and (heads or name.split(".")[-1] != "logits"):
            out.append((module.weight, False))
    return out


def _norms(w: Tensor, stacked: bool) -> Tensor:
    return w.detach().flatten(1).norm(dim=1) if stacked else w.detach().norm()  # (E,) or ()


class NormalizeProject(Targeted):
    """Normalize-and-Project: LayerNorm before each nonlinearity, weights projected back to their initial norms (Lyle et al. 2024)."""

    name = "nap"
    config_class = NaPConfig
    config: NaPConfig

    def __init__(self, config: NaPConfig | None = None, **overrides: Any) -> None:
        super().__init__(config, **overrides)
        self._init: dict[int, Tensor] = {}  # id(weight) -> its norm(s) at init, (E,) or ()
        self._weights: dict[str, list[tuple[nn.Parameter, bool]]] = {}  # role -> projected weights
        # Relative norm change a step made, ||W|| / ||W_0|| - 1, before projection (on the device):
        # its sum and its largest magnitude since the last log.
        self._growth_sum: Tensor | None = None
        self._growth_max: Tensor | None = None
        self._count = 0

    def on_training_start(self, algo: Any) -> None:
        roles = policy_roles(algo.policy)
        for role in self.roles:
            found = [pair for net in roles[role].networks for pair in projected_weights(net, self.config.heads)]
            self._weights[role] = found
            for w, stacked in found:
                self._init.setdefault(id(w), _norms(w, stacked).clone())

    @torch.no_grad()
    def after_update(self, algo: Any, phase: str) -> None:
        for role in active_roles(phase, self.roles):
            for w, stacked in self._weights.get(role, ()):
                now = _norms(w, stacked)
                ratio = now / self._init[id(w)]  # (E,) or ()
                scale = (1.0 / ratio).to(w.dtype)
                w.mul_(scale.view(-1, *([1] * (w.dim() - 1))) if stacked else scale)
                growth = ratio - 1.0
                self._growth_sum = growth.sum() if self._growth_sum is None else self._growth_sum + growth.sum()
                top = growth.abs().max()
                self._growth_max = top if self._growth_max is None else torch.maximum(self._growth_max, top)
                self._count += growth.numel()

    def logs(self) -> dict[str, float]:
        if self._growth_sum is None or self._growth_max is None:
            return {}
        out = {"nap_norm_growth": float(self._growth_sum) / self._count, "nap_norm_growth_max": float(self._growth_max)}
        self._growth_sum, self._growth_max, self._count = None, None, 0
        return out

    def state_dict(self, policy: Any) -> dict[str, Any]:
        names = parameter_names(policy)
        init = {names[key]: t.clone() for key, t in self._init.items() if key in names}
        return {"init": init} if init else {}  # nothing before training starts

    def load_state_dict(self, state: dict[str, Any], policy: Any) -> None:
        params = dict(policy.named_parameters())
        self._init = {id(params[name]): t.to(params[name].device) for name, t in state.get("init", {}).items()}
