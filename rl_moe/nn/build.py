"""The network registry: ``kind`` -> class, and :func:`build_network`.

It sits above every network module (routers, companion networks), so none of them imports it.
"""

from __future__ import annotations

from torch import nn

from rl_moe.nn.companions import SDMoE, SSMoE
from rl_moe.nn.config import NetConfig
from rl_moe.nn.dsc import DSCNet
from rl_moe.nn.init import INITS
from rl_moe.nn.moe import DenseMLP, DSMoE, RoutedMoE, SoftMoE
from rl_moe.nn.routing import ROUTERS
from rl_moe.nn.specnorm import spectral_normalize

#: Network class by kind: a kind in :data:`~rl_moe.nn.routing.ROUTERS` is a :class:`RoutedMoE`
#: with that router unless it has a class of its own below.
NETWORKS: dict[str, type[nn.Module]] = {
    **dict.fromkeys(ROUTERS, RoutedMoE),
    "sdmoe": SDMoE,
    "ssmoe": SSMoE,
    "dsc": DSCNet,
    "ds": DSMoE,
    "soft": SoftMoE,
    "mlp": DenseMLP,
}


def build_network(in_dim: int, out_dim: int, cfg: NetConfig | None = None, out_gain: float = 1.0, **overrides) -> nn.Module:
    """Build a network returning :class:`MoEOutput`.

    :param in_dim: input width (obs dim, or obs+action for a TD3 critic)
    :param out_dim: output width (action dim, or 1)
    :param cfg: architecture; ``overrides`` replace its fields (e.g. ``kind="mlp"``); with
        ``spectral_norm`` the hidden layers are parametrized after their initialisation
    :param out_gain: orthogonal init gain of the output heads (``init="orthogonal"`` only)
    """
    cfg = NetConfig(**{**(cfg.to_dict() if cfg else {}), **overrides})
    net = NETWORKS[cfg.kind](in_dim, out_dim, cfg, out_gain)
    scheme = INITS[cfg.init].apply
    if scheme is not None:
        scheme(net)
    if cfg.spectral_norm:
        spectral_normalize(net)
    return net
