"""The hook interface of the learners: what a regularizer sees and returns.

A regularizer is an object with explicit hooks. Per gradient step the learner builds one
:class:`LossContext` (for each role trained in the phase: its networks' outputs on the minibatch,
its reference loss and its parameters), calls :meth:`Regularizer.observe` and then
:meth:`Regularizer.penalty` with it, and adds ``coef * loss`` of every returned :class:`Penalty` to
the loss of that phase; it logs each term as ``train/loss_<name>`` and ``train/coef_<name>``.
Lifecycle hooks run when training starts, on task start and after each optimizer step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, NamedTuple

import torch
from torch import Tensor, nn

from rl_moe.maths import grads_norm
from rl_moe.policies.roles import Role, policy_roles

if TYPE_CHECKING:  # pragma: no cover
    from stable_baselines3.common.base_class import BaseAlgorithm

    from rl_moe.nn import MoEOutput

#: Phases of an update in which a penalty can be added -> the roles whose loss is optimised there.
PHASE_ROLES: dict[str, tuple[str, ...]] = {"ppo": ("actor", "critic"), "td3_actor": ("actor",), "td3_critic": ("critic",)}
#: The phases whose optimizer steps count as the learner's gradient steps, for a method acting
#: "every N updates": one per PPO minibatch, and one per TD3 gradient step (its critic's; the
#: actor's delayed steps, one in ``policy_delay``, are not counted).
GRADIENT_STEP_PHASES: tuple[str, ...] = ("ppo", "td3_critic")


class GradScale(NamedTuple):
    """Asks the learner for coef = rho * ||grad_params reference|| / (||grad_params loss|| + eps),
    each norm taken as sqrt(sum g^2 + norm_eps) (:func:`adaptive_coef`).

    The learner computes it while backpropagating, reusing the reference loss's gradients
    (SPHERE App. A.3), which saves one backward pass over computing both norms up front.
    """

    rho: float
    reference: Tensor
    params: tuple[nn.Parameter, ...]
    eps: float = 1e-8
    #: Called with the resolved coefficient, a detached () tensor (e.g. to reuse it later).
    on_resolve: Callable[[Tensor], None] | None = None
    #: Upper bound on |coef| (None: none).
    ceiling: float | None = None
    #: Where the scaled penalty's gradient points against the reference's, remove its component
    #: along the reference's gradient (PCGrad, Yu et al. 2020; the SPHERE authors' sphere_use_pcgrad).
    pcgrad: bool = False
    #: Added to each squared gradient norm under its square root (0: the plain norm; the SPHERE
    #: authors' code adds 1e-8, which floors both norms at 1e-4).
    norm_eps: float = 0.0


class Penalty(NamedTuple):
    """A named loss term; the learner adds ``coef * loss`` (``coef`` is a float or a detached ()
    tensor: a tensor needs no host read, which the sync-free GPU update requires).

    With ``scale`` set, ``coef`` is ignored and the learner sets it from gradient norms.
    """

    name: str
    loss: Tensor
    coef: float | Tensor
    scale: GradScale | None = None


class RoleStep(NamedTuple):
    """One role on one minibatch, computed once by the learner.

    :param role: the networks, optimizer and target copies (:class:`~rl_moe.policies.Role`)
    :param outputs: each network's output on the minibatch, aligned with ``role.networks``
        (None for a network that returns no :class:`~rl_moe.nn.MoEOutput`, e.g. plain SB3 ones)
    :param reference: the loss adaptive coefficients compare against (SPHERE App. A.3): PPO actor:
        policy + entropy term; PPO critic: the value loss; TD3: the phase's loss
    :param params: the role's trainable parameters (experts and gate; no log-std)
    """

    role: Role
    outputs: tuple["MoEOutput | None", ...]
    reference: Tensor
    params: tuple[nn.Parameter, ...]

    def pairs(self) -> list[tuple[nn.Module, "MoEOutput"]]:
        """(network, output) of every network that returned a :class:`~rl_moe.nn.MoEOutput`."""
        return [(n, o) for n, o in zip(self.role.networks, self.outputs) if o is not None]


@dataclass
class LossContext:
    """What a regularizer may use for one minibatch.

    :param algo: the learner (PPO/TD3 subclass); ``algo.policy`` is the SB3 policy
    :param phase: a key of :data:`PHASE_ROLES`
    :param batch: the SB3 rollout or replay minibatch
    :param roles: the roles trained in this phase (:data:`PHASE_ROLES`), by name
    :param losses: the base loss terms (PPO: ``policy``, ``value``, ``entropy``, ``actor`` = policy
        + entropy term; TD3: ``critic`` or ``actor``), still attached to the graph
    :param sync_free: the step runs without host syncs (and may be captured in a CUDA graph):
        a penalty must not read tensors back to the host nor branch on their values
    """

    algo: "BaseAlgorithm"
    phase: str
    batch: Any
    roles: dict[str, RoleStep] = field(default_factory=dict)
    losses: dict[str, Tensor] = field(default_factory=dict)
    sync_free: bool = False

    def active(self, targets: tuple[str, ...]) -> list[RoleStep]:
        """The steps of the roles among ``targets`` that this phase trains, in role order."""
        return [self.roles[r] for r in PHASE_ROLES.get(self.phase, ()) if r in targets and r in self.roles]


def loss_context(
    algo: "BaseAlgorithm",
    phase: str,
    batch: Any,
    outputs: dict[str, tuple["MoEOutput | None", ...]],
    references: dict[str, Tensor],
    losses: dict[str, Tensor],
    sync_free: bool = False,
) -> LossContext:
    """The context of one minibatch: the policy's roles trained in ``phase`` with their outputs
    (by role name) and reference losses.

    :param outputs: per role, its networks' outputs in ``Role.networks`` order
    :param references: per role trained in ``phase``, its reference loss
    """
    roles = policy_roles(algo.policy)
    steps = {}
    for name in PHASE_ROLES[phase]:
        role = roles[name]
        outs = tuple(outputs.get(name, ()))
        outs = outs + (None,) * (len(role.networks) - len(outs))
        steps[name] = RoleStep(role, outs, references[name], tuple(role.parameters))
    return LossContext(algo, phase, batch, steps, losses, sync_free)


class Regularizer:
    """Base class: every hook is optional; override what you need.

    :param name: the loss-term name used in the logger (``train/loss_<name>``)
    :param config_class: the frozen dataclass of its settings, for a regularizer in
        :data:`rl_moe.regularizers.REGISTRY` (built as ``cls(config=None, **overrides)``)
    """

    name: str = "regularizer"
    config_class: ClassVar[type]

    @property
    def graph_safe(self) -> bool:
        """Whether :meth:`penalty` can run sync-free and be replayed from a CUDA graph: no host
        reads, no Python state that must change between minibatches, no ``after_update`` work
        that does either. Learners take SB3's minibatches (PPO) when any is not."""
        return False

    def observe(self, ctx: LossContext) -> None:
        """Sees each minibatch before its backward pass (e.g. activation statistics of the
        roles' outputs); called before :meth:`penalty`."""

    def penalty(self, ctx: LossContext) -> list[Penalty]:
        """Loss terms for this minibatch (empty when the phase does not concern it)."""
        return []

    def on_training_start(self, algo: "BaseAlgorithm") -> None:
        """Called once the learner and its policy exist, before the first rollout."""

    def on_task_start(self, algo: "BaseAlgorithm", task_index: int) -> None:
        """Called by the continual scheduler when a new task begins."""

    def after_update(self, algo: "BaseAlgorithm", phase: str) -> None:
        """Called after each optimizer step of ``phase``."""

    def logs(self) -> dict[str, float]:
        """Extra scalars to log under ``train/`` (e.g. units reset so far)."""
        return {}

    def logged(self, values: dict[str, float]) -> None:
        """Sees the update's logged term means (``train/loss_*``, ``train/coef_*``), already read
        from the device: a regularizer can watch its own coefficient without another read."""

    def state_dict(self, policy: nn.Module) -> dict[str, Any]:
        """Internal state a resumed run needs to continue as if never stopped.

        Only tensors, numbers, strings, lists and dicts, so that it loads with
        ``torch.load(weights_only=True)``; modules and parameters are named by their path in
        ``policy``, since ``id()`` does not survive a restart. Stateless regularizers return {}.
        """
        return {}

    def load_state_dict(self, state: dict[str, Any], policy: nn.Module) -> None:
        """Restore the output of :meth:`state_dict` into this regularizer, built for ``policy``."""


def grad_norm(loss: Tensor, params: Iterable[nn.Parameter]) -> Tensor:
    """L2 norm of d loss / d params, without touching ``.grad`` (graph retained)."""
    params = [p for p in params if p.requires_grad]
    return grads_norm(torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True))


def adaptive_coef(rho: float, ref_norm: Tensor, pen_norm: Tensor, eps: float, norm_eps: float = 0.0) -> Tensor:
    """The adaptive coefficient rho * ||grad L_ref|| / (||grad L_pen|| + eps) as a detached ()
    tensor (SPHERE App. A.3): the one formula, which the learner applies
    (:func:`~rl_moe.algos.backward.regularized_backward`) and :func:`scaled_coef` reports.

    With ``norm_eps`` > 0 each norm is sqrt(||g||^2 + norm_eps), as the SPHERE authors' code takes
    it (``tree_l2_norm``, sphere-rl/sphere ``moe_ppo.py``; ``norm_eps = eps = 1e-8`` there): the
    penalty's norm never falls below sqrt(norm_eps), which caps lambda at
    rho * ||grad L_ref|| / (sqrt(norm_eps) + eps), and a penalty with no gradient still gets that
    capped coefficient (times a zero gradient: no effect on the update).

    With ``norm_eps`` = 0 a penalty with no gradient (SPHERE at isotropic features) gets 0, not
    rho * ||grad L_ref|| / eps (~1e6 in the logs); the update is the same either way.
    """
    if norm_eps > 0:
        ref_norm = torch.sqrt(ref_norm.square() + norm_eps)
        pen_norm = torch.sqrt(pen_norm.square() + norm_eps)
    return torch.where(pen_norm > 0, rho * ref_norm / (pen_norm + eps), torch.zeros_like(pen_norm)).detach()


def clamp_coef(coef: Tensor | float, ceiling: float | None) -> Tensor | float:
    """``coef`` bounded to [-ceiling, ceiling] (None: unbounded): the one λ-ceiling rule, for the
    coefficients the learner resolves and those a regularizer computes itself."""
    if ceiling is None:
        return coef
    return coef.clamp(-ceiling, ceiling) if isinstance(coef, Tensor) else max(-ceiling, min(ceiling, coef))


def scaled_coef(term: Penalty) -> float:
    """The coefficient a :class:`GradScale` asks for, computed on its own (two extra backward
    passes) with the learner's formula :func:`adaptive_coef` and ceiling :func:`clamp_coef`."""
    if term.scale is None:
        return term.coef
    s = term.scale
    params = [p for p in s.params if p.requires_grad]
    coef = clamp_coef(adaptive_coef(s.rho, grad_norm(s.reference, params), grad_norm(term.loss, params), s.eps, s.norm_eps), s.ceiling)
    assert isinstance(coef, Tensor)
    if s.on_resolve is not None:
        s.on_resolve(coef)
    return float(coef)
