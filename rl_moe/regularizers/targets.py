"""What a regularizer acts on: target roles, expert stacks and hidden weight matrices.

A regularizer targets *roles* (``actor`` or ``critic``; ``both`` = the two). The learner hands it,
per minibatch, the roles trained in the phase (:class:`~rl_moe.algos.hooks.RoleStep`: networks,
outputs, reference loss, parameters); lifecycle hooks get the policy's roles from
:func:`~rl_moe.policies.policy_roles`. The helpers here read the structure of a role's networks.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from torch import Tensor, nn

from rl_moe.algos.hooks import PHASE_ROLES
from rl_moe.nn import StackedExperts
from rl_moe.policies import Role

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


def active_roles(phase: str, roles: tuple[str, ...]) -> tuple[str, ...]:
    """The roles among ``roles`` trained in ``phase``."""
    return tuple(r for r in PHASE_ROLES.get(phase, ()) if r in roles)


def expert_stacks(net: nn.Module) -> list[StackedExperts]:
    """The expert stacks of a rl_moe network, in the order of ``MoEOutput.groups``."""
    shared = getattr(net, "shared", None)
    experts = getattr(net, "experts", None)
    stacks = [s for s in (shared, experts) if isinstance(s, StackedExperts)]
    return stacks


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
        return self.module[int(self.name)] if self.stacked else getattr(self.module, self.name)

    def rows_out(self) -> Tensor:
        w = self.tensor
        return w.transpose(1, 2) if self.stacked else w[None]  # (E, out, in)


def hidden_weights(net: nn.Module) -> list[WeightRef]:
    """Hidden-layer weights of one network.

    rl_moe networks: every expert layer but the heads, plus the gate's body layers (the gate
    logits are an output). Plain networks: every nn.Linear but the last (the output layer).
    """
    stacks = expert_stacks(net)
    if stacks:
        refs = [WeightRef(s.weights, str(i), True) for s in stacks for i in range(s.n_layers - 1)]
        body = _get(net, "gate.body")
        if body is not None:
            refs += [WeightRef(m, "weight", False) for m in body.modules() if isinstance(m, nn.Linear)]
        return refs
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
    return [WeightRef(m, "weight", False) for m in linears[:-1]]


def role_hidden_weights(role: Role, targets: bool = False) -> list[WeightRef]:
    """Hidden weights over all networks of a role (``targets``: of its TD3 target copies)."""
    nets = role.targets if targets else role.networks
    if len(nets) == 2 and isinstance(nets[1], nn.Linear) and not expert_stacks(nets[0]):
        # Plain SB3 actor-critic: (mlp_extractor branch, output Linear); the branch is all hidden.
        return [WeightRef(m, "weight", False) for m in nets[0].modules() if isinstance(m, nn.Linear)]
    return [r for n in nets for r in hidden_weights(n)]


def _get(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def module_names(policy: nn.Module) -> dict[int, str]:
    """id(module) -> its qualified name in ``policy`` (regularizer state is saved by name)."""
    return {id(m): n for n, m in policy.named_modules()}


def parameter_names(policy: nn.Module) -> dict[int, str]:
    """id(parameter) -> its qualified name in ``policy``."""
    return {id(p): n for n, p in policy.named_parameters()}
