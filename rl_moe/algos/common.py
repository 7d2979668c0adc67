"""Machinery shared by the regularized learners: collecting, summing and logging penalty terms."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Protocol, Sequence

import torch
from torch import Tensor

from rl_moe.algos.guard import check_update
from rl_moe.algos.trac import ReportingOptimizer
from rl_moe.policies.roles import policy_roles
from rl_moe.regularizers.hooks import Regularizer


class TermSink(Protocol):
    """Where the learner logs each penalty term of a minibatch (loss and coefficient)."""

    def add(self, name: str, loss: Tensor, coef: Tensor | float) -> None: ...


class DeviceTermLog:
    """Running sums kept on the device (no host sync per minibatch), read once per update.

    The sums are updated in place, so a CUDA graph captured around :meth:`add` keeps adding into
    the same tensors on every replay; such a caller counts the minibatches itself. Eager callers
    can rely on the per-term counts (TD3's two phases add their terms different numbers of times).
    """

    def __init__(self) -> None:
        self.sums: dict[str, Tensor] = {}
        self.counts: dict[str, int] = defaultdict(int)

    def add(self, name: str, loss: Tensor, coef: Tensor | float) -> None:
        for key, value in ((f"train/loss_{name}", loss), (f"train/coef_{name}", coef)):
            # A fill kernel, not a host-to-device copy (which a CUDA graph capture refuses).
            value = value.detach() if isinstance(value, Tensor) else loss.new_full((), float(value))
            if key not in self.sums:
                self.sums[key] = torch.zeros((), dtype=loss.dtype, device=loss.device)
            self.sums[key].add_(value)
            self.counts[key] += 1

    def zero_(self) -> None:
        for t in self.sums.values():
            t.zero_()
        self.counts.clear()

    def means(self, count: int | None = None) -> dict[str, float]:
        """Mean of each term over ``count`` additions (None: the additions :meth:`add` saw)."""
        if not self.sums or count == 0:
            return {}
        values = torch.stack(list(self.sums.values())).cpu().tolist()  # the one read per update
        return {key: v / (max(self.counts[key], 1) if count is None else count) for key, v in zip(self.sums, values)}


class RegularizedMixin:
    """Adds a list of :class:`Regularizer` objects to an SB3 algorithm.

    The penalties of one phase enter the update in
    :func:`~rl_moe.algos.backward.regularized_backward`; each term's loss and coefficient are logged
    as ``train/loss_<name>`` and ``train/coef_<name>`` (means over the update's minibatches).
    """

    regularizers: list[Regularizer]

    def _init_regularizers(self, regularizers: Sequence[Regularizer]) -> None:
        self.regularizers = list(regularizers)

    def _excluded_save_params(self) -> list[str]:
        # Regularizers hold references into the policy and are rebuilt by the caller on load.
        return [*super()._excluded_save_params(), "regularizers"]  # type: ignore[misc]

    def _setup_model(self) -> None:
        super()._setup_model()  # type: ignore[misc]
        for reg in self.regularizers:
            reg.on_training_start(self)  # type: ignore[arg-type]

    def flush_update_logs(self) -> None:
        """Write the last update's pending ``train/*`` values at the current step; each learner
        defines when SB3 would otherwise leave them unwritten."""
        raise NotImplementedError

    def start_task(self, task_index: int) -> None:
        """Notify every regularizer that task ``task_index`` begins (continual scheduler hook)."""
        for reg in self.regularizers:
            reg.on_task_start(self, task_index)  # type: ignore[arg-type]

    def _regularizer_keys(self) -> list[str]:
        return [f"{i}:{reg.name}" for i, reg in enumerate(self.regularizers)]

    def regularizer_state(self) -> dict[str, Any]:
        """Every regularizer's internal state (CBP utilities, the C-CHAIN snapshot, counters),
        keyed by position and name; saved next to each checkpoint so a resume continues exactly."""
        policy: Any = self.policy  # type: ignore[attr-defined]
        return {key: reg.state_dict(policy) for key, reg in zip(self._regularizer_keys(), self.regularizers)}

    def load_regularizer_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`regularizer_state` into this learner's (freshly built) regularizers.

        :raises ValueError: if ``state`` belongs to a different list of regularizers
        """
        keys = self._regularizer_keys()
        if sorted(state) != sorted(keys):
            raise ValueError(f"regularizer state holds {sorted(state)}, but this learner has {keys}")
        policy: Any = self.policy  # type: ignore[attr-defined]
        for key, reg in zip(keys, self.regularizers):
            reg.load_state_dict(state[key], policy)


def after_step(algo: Any, phase: str) -> None:
    """Each regularizer's ``after_update`` hook, after an optimizer step of ``phase``."""
    for reg in algo.regularizers:
        reg.after_update(algo, phase)


def record_update_logs(algo: Any, term_means: dict[str, float]) -> None:
    """Log the penalty terms (means over the update) and each regularizer's own scalars, then
    run the NaN guard on everything the update logged (every update path ends here).

    :raises NonFiniteError: if a logged ``train/*`` value, a weight or a gradient is not finite
    """
    logger = algo.logger
    for key, value in term_means.items():
        logger.record(key, value)
    for reg in algo.regularizers:
        reg.logged(term_means)
    for reg in algo.regularizers:
        for key, value in reg.logs().items():
            logger.record(f"train/{key}", value)
    record_optimizer_logs(algo)
    check_update(logger.name_to_value, algo.policy.parameters())


def record_optimizer_logs(algo: Any) -> None:
    """Scalars of optimizers that report their own (TRAC's S): ``train/<key>`` when every role
    shares one optimizer (PPO), ``train/<key>_<role>`` otherwise (TD3's actor and critic)."""
    roles = policy_roles(algo.policy)
    shared = len({id(role.optimizer) for role in roles.values()}) == 1
    for name, role in roles.items():
        if isinstance(role.optimizer, ReportingOptimizer):
            for key, value in role.optimizer.logs().items():
                algo.logger.record(f"train/{key}" if shared else f"train/{key}_{name}", value)
            if shared:
                return
