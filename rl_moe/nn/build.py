"""The network registry: ``kind`` -> class, and :func:`build_network`.

It sits above every network module (routers, companion networks), so none of them imports it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from rl_moe.nn.companions import SDMoE, SSMoE
from rl_moe.nn.config import NetConfig
from rl_moe.nn.dsc import DSCNet
from rl_moe.nn.init import INITS
from rl_moe.nn.moe import DenseMLP, DSMoE, MoEOutput, RoutedMoE, SoftMoE
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
    net.register_forward_pre_hook(_as_network_input)
    net.register_forward_hook(_as_network_output, always_call=True)
    return net


#: The per-sample fields of :class:`MoEOutput` that an unbatched observation gets back unbatched.
_PER_SAMPLE = ("out", "probs", "indices", "logits", "gate_embedding")


def _as_network_input(net: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """Accept what an env returns: a numpy array or a tensor of another dtype (MetaWorld gives
    float64) becomes a tensor of the network's own dtype and device; a matching tensor passes
    untouched (None: the arguments stay as they are). One observation ``(obs_dim,)`` runs as a
    batch of one, and :func:`_as_network_output` drops that batch axis again."""
    param = next(net.parameters(), None)
    x = args[0] if args else None
    unbatched = x is not None and np.ndim(x) == 1
    calls = net.__dict__.setdefault("_unbatched_calls", [])  # a stack: the output hook pops it
    calls.append(unbatched)
    if param is None or x is None or (isinstance(x, Tensor) and x.dtype == param.dtype and x.device == param.device and not unbatched):
        return None
    x = torch.as_tensor(np.asarray(x) if not isinstance(x, Tensor) else x, dtype=param.dtype, device=param.device)
    return (x[None] if unbatched else x, *args[1:])  # (obs_dim,) -> (1, obs_dim)


def _as_network_output(net: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
    """For an unbatched observation, the per-sample fields without the batch axis (``out``:
    ``(out_dim,)``, as ``nn.Linear`` does) and ``phi()`` likewise; ``groups`` keep the batch of one."""
    calls = net.__dict__.get("_unbatched_calls")
    unbatched = calls.pop() if calls else False
    if not unbatched or not isinstance(output, MoEOutput):
        return None
    return output._replace(**{f: getattr(output, f)[0] for f in _PER_SAMPLE}, unbatched=True)
