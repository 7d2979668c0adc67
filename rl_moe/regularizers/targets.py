"""What a regularizer acts on (target roles, expert stacks, hidden weight matrices) and the checks
of its settings.

A regularizer targets *roles* (``actor`` or ``critic``; ``both`` = the two). The learner hands it,
per minibatch, the roles trained in the phase (:class:`~rl_moe.algos.hooks.RoleStep`: networks,
outputs, reference loss, parameters); lifecycle hooks get the policy's roles from
:func:`~rl_moe.policies.policy_roles`. The helpers here read the structure of a role's networks
(the per-network ones, :func:`hidden_weights` and :func:`expert_stacks`, live in :mod:`rl_moe.nn.specnorm`).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, TypeVar

from torch import nn

from rl_moe.algos.hooks import PHASE_ROLES, Regularizer
from rl_moe.nn.specnorm import WeightRef, expert_stacks, hidden_weights
from rl_moe.policies import Role

C = TypeVar("C")

ROLES: tuple[str, ...] = ("actor", "critic")
#: ``target`` / ``placement`` values: the roles each one covers.
TARGETS: dict[str, tuple[str, ...]] = {"actor": ("actor",), "critic": ("critic",), "both": ("actor", "critic")}


def check_target(target: str, what: str = "target") -> tuple[str, ...]:
    """Roles of ``target``; ValueError naming the valid choices otherwise."""
    if target not in TARGETS:
        raise ValueError(f"unknown {what} {target!r}; valid choices: {', '.join(TARGETS)}")
    return TARGETS[target]


def check_choice(value: Any, choices: tuple[Any, ...] | dict[Any, Any], what: str) -> None:
    if value not in choices:
        raise ValueError(f"unknown {what} {value!r}; valid choices: {', '.join(map(str, choices))}")


def build_config(config_class: type[C], config: C | None, overrides: dict[str, Any], what: str) -> C:
    """``config`` (None: ``config_class``'s defaults) with ``overrides`` replacing fields; the
    config's own checks run on the result.

    :param what: the regularizer, as named in the error for an unknown field
    :raises ValueError: for an unknown field, naming the valid ones, or a bad value
    """
    names = [f.name for f in dataclasses.fields(config_class)]  # type: ignore[arg-type]
    unknown = sorted(set(overrides) - set(names))
    if unknown:
        raise ValueError(f"unknown {what} option {unknown[0]!r}; valid choices: {', '.join(names)}")
    hints = typing.get_type_hints(config_class)
    for name, value in overrides.items():
        _check_type(what, name, value, hints[name])
    base = config_class() if config is None else config
    return dataclasses.replace(base, **overrides) if overrides else base  # type: ignore[type-var]


#: JSON values a field of each type accepts (a suite file's ``"rho": "abc"`` must not pass).
_ACCEPTS: dict[type, tuple[type, ...]] = {float: (int, float), int: (int,), bool: (bool,), str: (str,)}


def _check_type(what: str, name: str, value: Any, hint: Any) -> None:
    """``ValueError`` unless ``value`` fits ``hint`` (plain types and ``X | None``; others pass)."""
    args = typing.get_args(hint)
    options = [a for a in args if a is not type(None)] if args else [hint]
    if value is None and type(None) in args:
        return
    if not all(o in _ACCEPTS for o in options):
        return  # tuples, nested configs: their own __post_init__ checks them
    ok = any(isinstance(value, _ACCEPTS[o]) and not (isinstance(value, bool) and o is not bool) for o in options)
    if not ok:
        wanted = " or ".join(o.__name__ for o in options) + (" or null" if type(None) in args else "")
        raise ValueError(f"{what} option {name!r} must be {wanted}, got {value!r}")


def active_roles(phase: str, roles: tuple[str, ...]) -> tuple[str, ...]:
    """The roles among ``roles`` trained in ``phase``."""
    return tuple(r for r in PHASE_ROLES.get(phase, ()) if r in roles)


def role_hidden_weights(role: Role, targets: bool = False) -> list[WeightRef]:
    """Hidden weights over all networks of a role (``targets``: of its TD3 target copies)."""
    nets = role.targets if targets else role.networks
    if len(nets) == 2 and isinstance(nets[1], nn.Linear) and not expert_stacks(nets[0]):
        # Plain SB3 actor-critic: (mlp_extractor branch, output Linear); the branch is all hidden.
        return [WeightRef(m, "weight", False) for m in nets[0].modules() if isinstance(m, nn.Linear)]
    return [r for n in nets for r in hidden_weights(n)]


def module_names(policy: nn.Module) -> dict[int, str]:
    """id(module) -> its qualified name in ``policy`` (regularizer state is saved by name)."""
    return {id(m): n for n, m in policy.named_modules()}


def parameter_names(policy: nn.Module) -> dict[int, str]:
    """id(parameter) -> its qualified name in ``policy``."""
    return {id(p): n for n, p in policy.named_parameters()}


class Targeted(Regularizer):
    """A regularizer whose settings (its ``config_class``, with a ``target`` field) choose the
    roles it acts on: ``self.config`` and ``self.roles`` are built here for all of them.

    :param config: the settings (default: ``config_class()``); ``overrides`` replace some fields
    """

    def __init__(self, config: Any = None, **overrides: Any) -> None:
        self.config = build_config(self.config_class, config, overrides, self.name)
        self.roles = TARGETS[self.config.target]
