"""Pure-torch MoE layers (no stable-baselines3 import): routers, stacked experts, networks."""

from rl_moe.nn.config import ACTIVATIONS, NETWORK_KINDS, NetConfig
from rl_moe.nn.experts import ExpertPass, StackedExperts, segment_matmul
from rl_moe.nn.moe import (
    AuxLosses,
    DenseMLP,
    DSCLosses,
    DSMoE,
    ExpertGroup,
    MoEOutput,
    RoutedMoE,
    SoftMoE,
    load_balance_loss,
    width_multiplier_for_params,
)
from rl_moe.nn.build import NETWORKS, build_network
from rl_moe.nn.companions import EVRerouted, SDMoE, SSMoE
from rl_moe.nn.dsc import DSCNet
from rl_moe.nn.gate import GateMLP
from rl_moe.nn.parts import MoENetwork, NetworkParts
from rl_moe.nn.routing import ROUTERS, Dispatch, Routing, make_dispatch, static_dispatch
from rl_moe.nn.sdmoe import SpectralExperts
from rl_moe.nn.specnorm import StackedSpectralNorm, WeightRef, apply_spectral_norm, hidden_weights, spectral_normalize, track_in_eval
from rl_moe.nn.static import static_shapes, static_shapes_enabled

__all__ = [
    "ACTIVATIONS",
    "AuxLosses",
    "DSCLosses",
    "NETWORK_KINDS",
    "NETWORKS",
    "ROUTERS",
    "DSCNet",
    "EVRerouted",
    "DSMoE",
    "DenseMLP",
    "Dispatch",
    "ExpertGroup",
    "ExpertPass",
    "GateMLP",
    "MoENetwork",
    "MoEOutput",
    "NetworkParts",
    "NetConfig",
    "RoutedMoE",
    "Routing",
    "SDMoE",
    "SSMoE",
    "SoftMoE",
    "SpectralExperts",
    "StackedExperts",
    "StackedSpectralNorm",
    "WeightRef",
    "apply_spectral_norm",
    "build_network",
    "hidden_weights",
    "load_balance_loss",
    "make_dispatch",
    "segment_matmul",
    "spectral_normalize",
    "static_dispatch",
    "static_shapes",
    "static_shapes_enabled",
    "track_in_eval",
    "width_multiplier_for_params",
]
