"""Spectral normalization (Miyato et al. 2018, arXiv:1802.05957; in RL: Bjorck et al. 2021).

An architecture option, applied once when training starts: every hidden layer of the target is
reparametrised as W / sigma_max(W) with :class:`StackedSpectralNorm`, the one-step power
iteration (:func:`rl_moe.maths.power_iteration`) with persistent vectors of torch's ``spectral_norm``, run for every expert of a stacked
(E, in, out) weight at once (nn.Linear weights are a stack of one). The vectors update in training
mode; TD3 target copies, kept in eval mode, update them in every forward so their sigma follows
the Polyak-averaged weights. The trained parameter stays the same tensor
(``parametrizations.<name>.original``), so optimizers built earlier keep working.

Choices: hidden layers = expert layers but heads, plus gate body layers (plain nets: every Linear
but the last). A saved policy has the parametrized state-dict keys; re-apply
:func:`apply_spectral_norm` to a fresh policy before loading its weights.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize

from rl_moe.maths import SingularPair, power_iteration, top_singular_value
from rl_moe.algos.hooks import Regularizer
from rl_moe.policies import policy_roles
from rl_moe.regularizers.targets import WeightRef, check_target, role_hidden_weights


class StackedSpectralNorm(nn.Module):
    """W -> W / sigma_max(W) per matrix, with persistent power-iteration vectors.

    :param weight: the initial weight: stacked (E, in, out), or an nn.Linear weight (out, in)
    :param stacked: whether ``weight`` is a stack of E matrices
    :param always_update: run the power step in eval mode too (TD3 target copies stay in eval
        mode but their weights keep moving with Polyak averaging)
    """

    def __init__(
        self, weight: Tensor, stacked: bool = True, always_update: bool = False, n_power_iterations: int = 1, eps: float = 1e-12
    ) -> None:
        super().__init__()
        self.stacked, self.always_update = stacked, always_update
        self.n_power_iterations, self.eps = n_power_iterations, eps
        w = self._as_stack(weight.detach())  # (E, a, b)
        gen = torch.Generator(device="cpu").manual_seed(0)
        u = torch.randn(w.shape[0], w.shape[1], generator=gen).to(w)  # (E, a)
        v = torch.randn(w.shape[0], w.shape[2], generator=gen).to(w)  # (E, b)
        self.register_buffer("_u", F.normalize(u, dim=1, eps=eps))
        self.register_buffer("_v", F.normalize(v, dim=1, eps=eps))
        self._power(w, 15)

    def _as_stack(self, weight: Tensor) -> Tensor:
        return weight if self.stacked else weight[None]

    def _power(self, w: Tensor, steps: int) -> None:
        self._u, self._v = power_iteration(w, SingularPair(self._u, self._v), steps, self.eps)

    def forward(self, weight: Tensor) -> Tensor:
        w = self._as_stack(weight)  # (E, a, b)
        if self.training or self.always_update:
            self._power(w.detach(), self.n_power_iterations)
        # Clones keep the vectors usable in backward after the next in-place update.
        sigma = top_singular_value(w, SingularPair(self._u.clone(), self._v.clone()))  # (E,)
        return weight / (sigma[:, None, None] if self.stacked else sigma[0])


def apply_spectral_norm(refs: list[WeightRef], always_update: bool = False) -> int:
    """Parametrize every weight of ``refs`` (skipping those already parametrized); returns the count."""
    count = 0
    for ref in refs:
        if parametrize.is_parametrized(ref.module, ref.name):
            continue
        norm = StackedSpectralNorm(ref.tensor.detach(), stacked=ref.stacked, always_update=always_update)
        parametrize.register_parametrization(ref.module, ref.name, norm)
        count += 1
    return count


class SpectralNorm(Regularizer):
    """Applies spectral normalization to the target's hidden layers when training starts.

    :param target: ``actor``, ``critic`` or ``both``
    """

    name = "specnorm"

    def __init__(self, target: str = "actor") -> None:
        self.roles = check_target(target)
        self.n_layers = 0

    def on_training_start(self, algo: Any) -> None:
        roles = policy_roles(algo.policy)
        for name in self.roles:
            self.n_layers += apply_spectral_norm(role_hidden_weights(roles[name]))
            # TD3 keeps target copies made before this hook: normalise them too so they match.
            apply_spectral_norm(role_hidden_weights(roles[name], targets=True), always_update=True)

    def logs(self) -> dict[str, float]:
        return {"specnorm_layers": float(self.n_layers)}

