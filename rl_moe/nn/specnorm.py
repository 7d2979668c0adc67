"""Spectral normalization (Miyato et al. 2018, arXiv:1802.05957; in RL: Bjorck et al. 2021).

An architecture option (:attr:`rl_moe.nn.NetConfig.spectral_norm`): :func:`rl_moe.nn.build_network`
reparametrises every hidden layer as W / sigma_max(W) with :class:`StackedSpectralNorm`, the
one-step power iteration (:func:`rl_moe.maths.power_iteration`) with persistent vectors of torch's
``spectral_norm``, run for every expert of a stacked (E, in, out) weight at once (nn.Linear
weights are a stack of one). The vectors update in training mode; copies kept in eval mode whose
weights still move (TD3's Polyak-averaged targets) update them in every forward once
:func:`track_in_eval` marked them. The trained parameter is ``parametrizations.<name>.original``.

Hidden layers = expert layers but heads, plus gate body layers (plain nets: every Linear but the
last). State dicts carry the parametrized keys and the vectors, so a network built from the same
config loads them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize

from rl_moe.maths import SingularPair, power_iteration, top_singular_value
from rl_moe.nn.experts import StackedExperts
from rl_moe.nn.parts import MoENetwork
from rl_moe.nn.reuse import ScopedValue


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
        self._reused: ScopedValue[Tensor] = ScopedValue()

    def _as_stack(self, weight: Tensor) -> Tensor:
        return weight if self.stacked else weight[None]

    def _power(self, w: Tensor, steps: int) -> None:
        self._u, self._v = power_iteration(w, SingularPair(self._u, self._v), steps, self.eps)

    def forward(self, weight: Tensor) -> Tensor:
        if self.training or self.always_update or torch.is_grad_enabled():
            return self._normalized(weight)
        # No power step and no autograd: W / sigma is a function of the weight and the vectors
        # alone, so a rollout's or an evaluation's calls (within :func:`~rl_moe.nn.reuse.weights_fixed`)
        # share one. Dividing every hidden weight again on each call had cost more than the rest
        # of a policy call at batch 8 (benchmarks/README.md, ``acting_forward.py``).
        return self._reused.get(lambda: (weight, self._u, self._v), lambda: self._normalized(weight))

    def _normalized(self, weight: Tensor) -> Tensor:
        w = self._as_stack(weight)  # (E, a, b)
        if self.training or self.always_update:
            self._power(w.detach(), self.n_power_iterations)
        # Clones keep the vectors usable in backward after the next in-place update.
        sigma = top_singular_value(w, SingularPair(self._u.clone(), self._v.clone()))  # (E,)
        return weight / (sigma[:, None, None] if self.stacked else sigma[0])


class WeightRef(NamedTuple):
    """A hidden weight matrix (or a stack of E of them).

    ``stacked`` weights are (E, in, out) and used as ``x @ W[e]``; nn.Linear weights are (out, in).
    ``rows_out`` returns the (E, out, in) view whose rows are the output units either way.
    """

    module: nn.Module
    name: str
    stacked: bool

    @property
    def tensor(self) -> Tensor:
        # torch.nn.utils.parametrize names a parametrized tensor by its attribute name
        return self.module[int(self.name)] if self.stacked else getattr(self.module, self.name)

    def rows_out(self) -> Tensor:
        w = self.tensor
        return w.transpose(1, 2) if self.stacked else w[None]  # (E, out, in)


def expert_stacks(net: nn.Module) -> list[StackedExperts]:
    """The expert stacks of a rl_moe network, in the order of ``MoEOutput.groups``."""
    return list(net.expert_stacks()) if isinstance(net, MoENetwork) else []


def hidden_weights(net: nn.Module) -> list[WeightRef]:
    """Hidden-layer weights of one network.

    rl_moe networks: every expert layer but the heads, plus the gate's body layers (the gate
    logits are an output). Plain networks: every nn.Linear but the last (the output layer).
    """
    stacks = expert_stacks(net)
    if stacks:
        refs = [WeightRef(s.weights, str(i), True) for s in stacks for i in range(s.n_layers - 1)]
        gate = net.gate_mlp() if isinstance(net, MoENetwork) else None
        if gate is not None:
            refs += [WeightRef(m, "weight", False) for m in gate.body.modules() if isinstance(m, nn.Linear)]
        return refs
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
    return [WeightRef(m, "weight", False) for m in linears[:-1]]


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


def spectral_normalize(net: nn.Module) -> int:
    """Spectrally normalise every hidden layer of ``net`` in place; returns the layers newly normalised."""
    return apply_spectral_norm(hidden_weights(net))


def track_in_eval(module: nn.Module) -> int:
    """Let every spectral norm under ``module`` update its vectors in eval mode too (copies whose
    weights move without training steps, such as TD3 targets); returns how many it marked."""
    norms = [m for m in module.modules() if isinstance(m, StackedSpectralNorm)]
    for norm in norms:
        norm.always_update = True
    return len(norms)
