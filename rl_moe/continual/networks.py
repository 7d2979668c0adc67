"""Named networks and SPHERE lambda arithmetics: what a run trained on, by name.

The SPHERE paper's protocols (``cw10``, ``cw20``, ``hb5``) build their networks as the SPHERE
authors' code does (sphere-rl/sphere, ``src/algorithms/moe/policies.py``): the ``authors``
network. The networks' own initialisation with a one-layer gate, the SB3/CleanRL convention and
this suite's default before the paper's protocols took the authors' network, is ``sb3``. A suite
names its network in its file (``"network"``); ``--preset authors`` or ``--preset sb3`` picks one
for any suite.

SPHERE's adaptive lambda = rho ||grad L_ref|| / (||grad L_SPHERE|| + eps) is computed with the
authors' arithmetic by default on every suite (:data:`LAMBDA_ARITHMETICS`); ``ours`` names the
plain norms this suite used before, kept as a setting.

``config.json`` records the ``--preset`` by name and, derived from the settings themselves, the
network and arithmetic a run trained with (:func:`network_name`, :func:`arithmetic_name`), so a
run of any age is labelled from what it stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rl_moe.nn.init import INITS


@dataclass(frozen=True)
class NetworkPreset:
    """A network by name: the :class:`~rl_moe.continual.config.NetSettings` fields that make it.

    :param name: the name a suite file and ``--preset`` use
    :param settings: ``net`` field -> value (tuples for widths)
    :param kinds: the network kinds it builds (None: every kind)
    :param description: one line for ``--list`` and the docs
    """

    name: str
    settings: Mapping[str, Any]
    kinds: tuple[str, ...] | None
    description: str

    def builds(self, kind: str) -> bool:
        return self.kinds is None or kind in self.kinds

    def overrides(self) -> tuple[str, ...]:
        """The preset as ``--set`` strings (``net.gate_hidden=256,256,256``)."""
        text = {k: ",".join(map(str, v)) if isinstance(v, tuple) else str(v) for k, v in self.settings.items()}
        return tuple(f"net.{k}={v}" for k, v in text.items())


#: Network name -> preset. ``authors`` covers the kinds whose every parameter LeCun init knows
#: (:data:`rl_moe.nn.init.INITS`); the authors' code has no Soft MoE, SD-MoE, DSC or SSMoE.
NETWORKS: dict[str, NetworkPreset] = {
    "authors": NetworkPreset(
        "authors", {"init": "lecun", "gate_hidden": (256, 256, 256)}, INITS["lecun"].kinds,
        "the SPHERE authors' network: Flax LeCun-normal init on every dense layer (heads and gate logits too), zero biases, a 3 x 256 gate",
    ),
    "sb3": NetworkPreset(
        "sb3", {"init": "orthogonal", "gate_hidden": (256,)}, None,
        "the SB3/CleanRL convention: orthogonal init (gain sqrt 2, 0.01 on the mean head), a 1 x 256 gate",
    ),
}  # fmt: skip

#: The network of a suite that names none, and of a method the suite's network does not build.
FALLBACK_NETWORK = "sb3"

#: SPHERE's lambda arithmetic by name -> its ``reg.sphere`` fields. ``authors``: each gradient
#: norm sqrt(sum g^2 + 1e-8), the division's eps again, over the actor's log-std too (their
#: ``tree_l2_norm`` over the whole actor tree); ``ours``: the plain norms over experts and gate.
LAMBDA_ARITHMETICS: dict[str, Mapping[str, Any]] = {
    "authors": {"norm_eps": 1e-8, "log_std_in_theta": True},
    "ours": {"norm_eps": 0.0, "log_std_in_theta": False},
}
DEFAULT_ARITHMETIC = "authors"
#: The label of settings that match no named network or arithmetic.
CUSTOM = "custom"


def suite_network(name: str | None, kind: str) -> str:
    """The network a suite that names ``name`` (None: none) builds for a method of ``kind``:
    its own where it builds that kind, else :data:`FALLBACK_NETWORK`."""
    preset = NETWORKS.get(name or FALLBACK_NETWORK, NETWORKS[FALLBACK_NETWORK])
    return preset.name if preset.builds(kind) else FALLBACK_NETWORK


def network_name(net: Any) -> str:
    """The named network whose fields ``net`` (a ``NetSettings`` or ``NetConfig``) holds, else
    ``custom`` (``--preset tiny``'s gate, a ``--set net.init``)."""
    for preset in NETWORKS.values():
        if all(_same(getattr(net, k, None), v) for k, v in preset.settings.items()):
            return preset.name
    return CUSTOM


def arithmetic_name(sphere: Any) -> str:
    """The named lambda arithmetic of a ``SphereConfig``, else ``custom``."""
    for name, fields in LAMBDA_ARITHMETICS.items():
        if all(_same(getattr(sphere, k, None), v) for k, v in fields.items()):
            return name
    return CUSTOM


def _same(a: Any, b: Any) -> bool:
    if isinstance(b, tuple):
        return a is not None and tuple(a) == b
    return a == b
