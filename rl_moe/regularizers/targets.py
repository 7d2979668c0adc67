"""Which networks, outputs, losses and weight matrices a regularizer acts on.

A regularizer targets a *role* (``actor`` or ``critic``; ``both`` = the two). These helpers map a
role to the modules of a policy and to the outputs and reference losses of a :class:`LossContext`,
for PPO (``MoEActorCriticPolicy`` or a plain SB3 ``ActorCriticPolicy``) and TD3 (``MoETD3Policy`` or
SB3's ``TD3Policy``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from torch import Tensor, nn

from rl_moe.nn import MoEOutput, StackedExperts
from rl_moe.regularizers.base import LossContext

ROLES: tuple[str, ...] = ("actor", "critic")
#: ``target`` / ``placement`` values: the roles each one covers.
TARGETS: dict[str, tuple[str, ...]] = {"actor": ("actor",), "critic": ("critic",), "both": ("actor", "critic")}
#: Roles whose loss is optimised in each phase.
PHASE_ROLES: dict[str, tuple[str, ...]] = {"ppo": ("actor", "critic"), "td3_actor": ("actor",), "td3_critic": ("critic",)}
#: Reference loss of each role per algorithm family (keys of ``LossContext.losses``).
REFERENCE_LOSS: dict[tuple[str, str], str] = {
    ("ppo", "actor"): "actor",
    ("ppo", "critic"): "value",
    ("td3_actor", "actor"): "actor",
    ("td3_critic", "critic"): "critic",
}


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


def role_networks(policy: nn.Module, role: str) -> list[nn.Module]:
    """The modules of ``role`` (TD3 critics: every Q-network)."""
    if role == "actor":
        for path in ("actor_net", "actor.net", "actor.mu"):
            net = _get(policy, path)
            if isinstance(net, nn.Module):
                return [net]
        if hasattr(policy, "mlp_extractor"):  # plain SB3 actor-critic
            return [policy.mlp_extractor.policy_net, policy.action_net]
    else:
        net = _get(policy, "critic_net")
        if isinstance(net, nn.Module):
            return [net]
        for path in ("critic.q_nets", "critic.q_networks"):
            nets = _get(policy, path)
            if nets is not None:
                return list(nets)
        if hasattr(policy, "mlp_extractor"):
            return [policy.mlp_extractor.value_net, policy.value_net]
    raise ValueError(f"cannot find the {role} network of {type(policy).__name__}; valid choices: a rl_moe or SB3 PPO/TD3 policy")


def role_parameters(policy: nn.Module, role: str) -> list[nn.Parameter]:
    """Trainable parameters of the role's networks (experts and gate; no log-std)."""
    return [p for net in role_networks(policy, role) for p in net.parameters() if p.requires_grad]


def role_outputs(ctx: LossContext, role: str) -> list[tuple[nn.Module, MoEOutput]]:
    """(network, output on this minibatch) pairs of ``role``; empty when none is a MoEOutput."""
    nets = role_networks(ctx.algo.policy, role)
    if role == "actor":
        outs = [ctx.actor_out]
    else:
        outs = [ctx.critic_out] if ctx.phase == "ppo" else (ctx.extra.get("critic_outputs") or [ctx.critic_out])
    return [(n, o) for n, o in zip(nets, outs) if isinstance(o, MoEOutput)]


def reference_loss(ctx: LossContext, role: str) -> Tensor:
    """The base loss the adaptive coefficients compare against (SPHERE App. A.3)."""
    key = REFERENCE_LOSS.get((ctx.phase, role))
    if key is None or key not in ctx.losses:
        raise ValueError(f"no reference loss for role {role!r} in phase {ctx.phase!r}; got {', '.join(ctx.losses)}")
    return ctx.losses[key]


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


def role_hidden_weights(policy: nn.Module, role: str) -> list[WeightRef]:
    """Hidden weights over all networks of a role."""
    nets = role_networks(policy, role)
    if len(nets) == 2 and isinstance(nets[1], nn.Linear) and not expert_stacks(nets[0]):
        # Plain SB3 actor-critic: (mlp_extractor branch, output Linear); the branch is all hidden.
        return [WeightRef(m, "weight", False) for m in nets[0].modules() if isinstance(m, nn.Linear)]
    return [r for n in nets for r in hidden_weights(n)]


def optimizers(algo: Any) -> list[Any]:
    """Every torch optimizer of the learner's policy (PPO: one; TD3: actor and critic)."""
    found = []
    for path in ("optimizer", "actor.optimizer", "critic.optimizer"):
        opt = _get(algo.policy, path)
        if opt is not None and opt not in found:
            found.append(opt)
    return found


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
