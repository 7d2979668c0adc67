"""Regularizers: SPHERE and the plasticity baselines, in a registry by name.

Each regularizer takes a frozen settings dataclass (its class's ``config_class``, defined in its
module) or keyword arguments overriding that dataclass's fields.

The hook interface they implement (:class:`Regularizer`, :class:`LossContext`, :class:`Penalty`)
lives with the learners in :mod:`rl_moe.regularizers.hooks` and is re-exported here.
"""

from __future__ import annotations

from typing import Any

from rl_moe.regularizers.hooks import (
    GradScale,
    LossContext,
    Penalty,
    Regularizer,
    RoleStep,
    adaptive_coef,
    grad_norm,
    loss_context,
    scaled_coef,
)
from rl_moe.regularizers.cbp import CBPConfig, ContinualBackprop
from rl_moe.regularizers.cchain import CChain, CChainConfig
from rl_moe.regularizers.dsc import DSCAux, DSCConfig
from rl_moe.regularizers.injection import InjectionConfig, PlasticityInjection
from rl_moe.regularizers.l2init import L2Init, L2InitConfig
from rl_moe.regularizers.load_balance import LoadBalance, LoadBalanceConfig
from rl_moe.regularizers.nap import NaPConfig, NormalizeProject
from rl_moe.regularizers.ortho import OrthoConfig, Orthogonality
from rl_moe.regularizers.parseval import Parseval, ParsevalConfig
from rl_moe.regularizers.redo import ReDo, ReDoConfig
from rl_moe.regularizers.reset import Reset, ResetConfig
from rl_moe.regularizers.sdmoe import SDMoEConfig, SDRefresh
from rl_moe.regularizers.snp import ShrinkPerturb, SNPConfig
from rl_moe.regularizers.specreg import SpecRegConfig, SpectralReg
from rl_moe.regularizers.sphere import Sphere
from rl_moe.regularizers.sphere_config import SphereConfig, sphere_config

#: Regularizers by method name (CLI ``--method``); each key is also the class's ``name`` and its
#: log tag (``train/loss_<name>``). Each class's ``config_class`` holds its settings and defaults.
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
    "snp": ShrinkPerturb,
    "l2init": L2Init,
    "nap": NormalizeProject,
    "injection": PlasticityInjection,
    "reset": Reset,
}


def make_regularizer(name: str, **kwargs: Any) -> Regularizer:
    """Build the regularizer registered as ``name``; ``kwargs`` are fields of its ``config_class``.

    :raises ValueError: for an unknown name or field, naming the valid choices, or a bad value
    """
    if name not in REGISTRY:
        raise ValueError(f"unknown regularizer {name!r}; valid choices: {', '.join(REGISTRY)}")
    return REGISTRY[name](**kwargs)


__all__ = [
    "REGISTRY",
    "CBPConfig",
    "CChain",
    "CChainConfig",
    "ContinualBackprop",
    "DSCAux",
    "DSCConfig",
    "InjectionConfig",
    "L2Init",
    "L2InitConfig",
    "LoadBalance",
    "LoadBalanceConfig",
    "LossContext",
    "NaPConfig",
    "NormalizeProject",
    "OrthoConfig",
    "PlasticityInjection",
    "Orthogonality",
    "Parseval",
    "ParsevalConfig",
    "Penalty",
    "ReDo",
    "SNPConfig",
    "ShrinkPerturb",
    "ReDoConfig",
    "Reset",
    "ResetConfig",
    "SDMoEConfig",
    "SpecRegConfig",
    "RoleStep",
    "SDRefresh",
    "Regularizer",
    "SpectralReg",
    "Sphere",
    "SphereConfig",
    "grad_norm",
    "adaptive_coef",
    "GradScale",
    "scaled_coef",
    "loss_context",
    "make_regularizer",
    "sphere_config",
]
