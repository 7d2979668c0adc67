"""Weight initialisation schemes by name (:data:`INITS`), applied once a network is built.

- ``orthogonal``: each network's own initialisation, the SB3 / CleanRL convention (orthogonal
  weights with gain sqrt(2) for ReLU hidden layers, 0.01 on a policy's mean head, 1 on value heads
  and gate logits; zero biases);
- ``lecun``: Flax's default for ``nn.Dense``, which the SPHERE authors' JAX code (sphere-rl/sphere,
  ``src/algorithms/moe/policies.py``, on SBX with ``ortho_init=False``) uses for every layer, heads
  and gate included: a normal of variance 1/fan_in truncated at two standard deviations, zero
  biases. LayerNorm affines keep 1 and 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor, nn

from rl_moe.nn.experts import StackedExperts

#: Standard deviation of a unit normal truncated to [-2, 2]; Flax divides by it so that the
#: truncated draw keeps the variance asked for.
_TRUNCATED_STD = 0.87962566103423978


def lecun_normal_(weight: Tensor, fan_in: int) -> None:
    """Fill ``weight`` in place with Flax's ``lecun_normal``: variance 1/fan_in, truncated at 2 sigma."""
    std = math.sqrt(1.0 / fan_in) / _TRUNCATED_STD
    nn.init.trunc_normal_(weight, std=std, a=-2.0 * std, b=2.0 * std)


def _lecun(net: nn.Module) -> None:
    covered: set[int] = set()
    with torch.no_grad():
        for module in net.modules():
            if type(module) is StackedExperts:  # subclasses compose their weights from other parts
                for w in module.weights:
                    for e in range(w.shape[0]):
                        lecun_normal_(w[e], w.shape[1])
                for b in module.biases:
                    b.zero_()
                covered |= {id(p) for p in module.parameters()}  # LayerNorm affines keep 1 and 0
            elif isinstance(module, nn.Linear):
                lecun_normal_(module.weight, module.in_features)
                if module.bias is not None:
                    module.bias.zero_()
                covered |= {id(p) for p in module.parameters(recurse=False)}
            elif isinstance(module, nn.LayerNorm):
                covered |= {id(p) for p in module.parameters(recurse=False)}
    missing = [name for name, p in net.named_parameters() if id(p) not in covered]
    if missing:  # a kind listed in INITS grew a parameter this scheme does not know
        raise ValueError(f"init 'lecun' covers linear layers and stacked experts only; not {', '.join(missing)}")


class InitScheme(NamedTuple):
    """An initialisation: what it does to a built network, and the network kinds it covers."""

    apply: Callable[[nn.Module], None] | None  # None: the networks' own initialisation
    kinds: tuple[str, ...] | None  # None: every kind


#: Scheme name -> :class:`InitScheme` (``NetConfig.init``).
INITS: dict[str, InitScheme] = {
    "orthogonal": InitScheme(None, None),
    # The kinds whose every parameter is a linear layer, a stacked expert or a LayerNorm affine.
    "lecun": InitScheme(_lecun, ("topk", "ds", "dense_moe", "expert_choice", "mlp")),
}
