"""Regularizers: SPHERE and the plasticity baselines, in a registry by name.

The hook interface they implement (:class:`Regularizer`, :class:`LossContext`, :class:`Penalty`)
lives with the learners in :mod:`rl_moe.algos.hooks` and is re-exported here.
"""

from __future__ import annotations

from typing import Any

from rl_moe.algos.hooks import (
    PHASES,
    GradScale,
    LossContext,
    Penalty,
    Regularizer,
    RoleStep,
    grad_norm,
    grad_ratio_coef,
    loss_context,
    scaled_coef,
)
from rl_moe.regularizers.cbp import ContinualBackprop
from rl_moe.regularizers.cchain import CChain
from rl_moe.regularizers.dsc import DSCAux
from rl_moe.regularizers.load_balance import LoadBalance
from rl_moe.regularizers.ortho import Orthogonality
from rl_moe.regularizers.parseval import Parseval
from rl_moe.regularizers.redo import ReDo
from rl_moe.regularizers.sdmoe import SDRefresh
from rl_moe.regularizers.specreg import SpectralReg
from rl_moe.regularizers.sphere import Sphere, SphereConfig, sphere_config

#: Regularizers by method name (CLI ``--method``); each key is also the class's ``name`` and its
#: log tag (``train/loss_<name>``).
REGISTRY: dict[str, type[Regularizer]] = {
    "sphere": Sphere,
    "parseval": Parseval,
    "cbp": ContinualBackprop,
    "redo": ReDo,
    "cchain": CChain,
    "specreg": SpectralReg,
    "load_balance": LoadBalance,
    "ortho": Orthogonality,
    "sdmoe": SDRefresh,
    "dsc": DSCAux,
}


def make_regularizer(name: str, **kwargs: Any) -> Regularizer:
    """Build the regularizer registered as ``name`` with its keyword arguments.

    :raises ValueError: for an unknown name or argument, naming the valid choices
    """
    if name not in REGISTRY:
        raise ValueError(f"unknown regularizer {name!r}; valid choices: {', '.join(REGISTRY)}")
    cls = REGISTRY[name]
    try:
        return cls(**kwargs)
    except TypeError as err:
        import inspect

        valid = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "config", "overrides")]
        if cls is Sphere:
            valid += list(SphereConfig.__dataclass_fields__)
        raise ValueError(f"bad arguments for regularizer {name!r} ({err}); valid choices: {', '.join(valid)}") from None


__all__ = [
    "PHASES",
    "REGISTRY",
    "CChain",
    "ContinualBackprop",
    "DSCAux",
    "LoadBalance",
    "LossContext",
    "Orthogonality",
    "Parseval",
    "Penalty",
    "ReDo",
    "RoleStep",
    "SDRefresh",
    "Regularizer",
    "SpectralReg",
    "Sphere",
    "SphereConfig",
    "grad_norm",
    "grad_ratio_coef",
    "GradScale",
    "scaled_coef",
    "loss_context",
    "make_regularizer",
    "sphere_config",
]
