"""The regularizer interface used by :mod:`rl_moe.algos`.

A regularizer is an object with explicit hooks. The learner calls, per gradient step,
:meth:`Regularizer.penalty` with a :class:`LossContext` and adds ``coef * loss`` of every returned
:class:`Penalty` to the loss of that phase; it logs each term as ``train/loss_<name>`` and
``train/coef_<name>``. Lifecycle hooks run on task start and after each optimizer step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, NamedTuple

import torch
from torch import Tensor, nn

from rl_moe.maths import grads_norm

if TYPE_CHECKING:  # pragma: no cover
    from stable_baselines3.common.base_class import BaseAlgorithm

    from rl_moe.nn import MoEOutput

#: Phases of an update in which a penalty can be added.
PHASES: tuple[str, ...] = ("ppo", "td3_critic", "td3_actor")


class GradScale(NamedTuple):
    """Asks the learner for coef = rho * ||grad_params reference|| / (||grad_params loss|| + eps).

    The learner computes it while backpropagating, reusing the reference loss's gradients
    (SPHERE App. A.3), which saves one backward pass over computing both norms up front.
    """

    rho: float
    reference: Tensor
    params: tuple[nn.Parameter, ...]
    eps: float = 1e-8
    #: Called with the resolved coefficient, a detached () tensor (e.g. to reuse it later).
    on_resolve: Callable[[Tensor], None] | None = None


class Penalty(NamedTuple):
    """A named loss term; the learner adds ``coef * loss`` (``coef`` is a float or a detached ()
    tensor: a tensor needs no host read, which the sync-free GPU update requires).

    With ``scale`` set, ``coef`` is ignored and the learner sets it from gradient norms.
    """

    name: str
    loss: Tensor
    coef: float | Tensor
    scale: GradScale | None = None


@dataclass
class LossContext:
    """What a penalty may use for one minibatch.

    :param algo: the learner (PPO/TD3 subclass); ``algo.policy`` is the SB3 policy
    :param phase: one of :data:`PHASES`
    :param batch: the SB3 rollout or replay minibatch
    :param actor_out: the actor network's output on this minibatch (None if not computed)
    :param critic_out: the critic network's output(s); for TD3, the first Q-network's
    :param losses: the base loss terms (PPO: ``policy``, ``value``, ``entropy``, ``actor`` = policy
        + entropy term; TD3: ``critic`` or ``actor``), still attached to the graph
    :param extra: anything else a learner wants to pass on
    :param sync_free: the step runs without host syncs (and may be captured in a CUDA graph):
        a penalty must not read tensors back to the host nor branch on their values
    """

    algo: "BaseAlgorithm"
    phase: str
    batch: Any
    actor_out: "MoEOutput | None" = None
    critic_out: "MoEOutput | None" = None
    losses: dict[str, Tensor] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    sync_free: bool = False


class Regularizer:
    """Base class: every hook is optional; override what you need.

    :param name: the loss-term name used in the logger (``train/loss_<name>``)
    """

    name: str = "regularizer"

    @property
    def graph_safe(self) -> bool:
        """Whether :meth:`penalty` can run sync-free and be replayed from a CUDA graph: no host
        reads, no Python state that must change between minibatches, no ``after_update`` work
        that does either. Learners fall back to their standard update when any is not."""
        return False

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


def scaled_coef(term: Penalty) -> float:
    """The coefficient a :class:`GradScale` asks for, computed directly (two extra backward passes)."""
    if term.scale is None:
        return term.coef
    s = term.scale
    coef = grad_ratio_coef(s.rho, s.reference, term.loss, s.params, s.eps)
    if s.on_resolve is not None:
        s.on_resolve(torch.tensor(coef))
    return coef


def grad_ratio_coef(
    rho: float, reference: Tensor, penalty: Tensor, params: Iterable[nn.Parameter], eps: float = 1e-8
) -> float:
    """rho * stopgrad(||grad reference|| / (||grad penalty|| + eps)) over ``params`` (SPHERE App. A.3)."""
    params = list(params)
    num = grad_norm(reference, params)
    den = grad_norm(penalty, params)
    return float(rho * (num / (den + eps)).item())
