"""Machinery shared by the regularized learners: collecting, summing and logging penalty terms."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Sequence

import numpy as np
from torch import Tensor

from rl_moe.regularizers.base import LossContext, Penalty, Regularizer


class RegularizedMixin:
    """Adds a list of :class:`Regularizer` objects to an SB3 algorithm.

    The penalties of one phase are summed in :meth:`_add_penalties`, the only place where extra
    loss terms enter an update; each term's loss and coefficient are logged as
    ``train/loss_<name>`` and ``train/coef_<name>`` (means over the update's minibatches).
    """

    regularizers: list[Regularizer]

    def _init_regularizers(self, regularizers: Sequence[Regularizer]) -> None:
        self.regularizers = list(regularizers)
        self._penalty_log: dict[str, list[float]] = defaultdict(list)

    def _excluded_save_params(self) -> list[str]:
        # Regularizers hold references into the policy and are rebuilt by the caller on load.
        return [*super()._excluded_save_params(), "regularizers", "_penalty_log"]  # type: ignore[misc]

    def _setup_model(self) -> None:
        super()._setup_model()  # type: ignore[misc]
        if not hasattr(self, "regularizers"):
            self._init_regularizers(())
        for reg in self.regularizers:
            reg.on_training_start(self)  # type: ignore[arg-type]

    def start_task(self, task_index: int) -> None:
        """Notify every regularizer that task ``task_index`` begins (continual scheduler hook)."""
        for reg in self.regularizers:
            reg.on_task_start(self, task_index)  # type: ignore[arg-type]

    def _add_penalties(self, base: Tensor, ctx: LossContext) -> Tensor:
        """``base + sum(coef * loss)`` over every regularizer's penalties for ``ctx``."""
        total = base
        for reg in self.regularizers:
            for term in reg.penalty(ctx):
                self._log_term(term)
                # Skipping zero coefficients keeps rho=0 runs bit-identical to unregularized ones.
                if term.coef != 0.0:
                    total = total + term.coef * term.loss
        return total

    def _after_update(self, phase: str) -> None:
        for reg in self.regularizers:
            reg.after_update(self, phase)  # type: ignore[arg-type]

    def _log_term(self, term: Penalty) -> None:
        self._penalty_log[f"train/loss_{term.name}"].append(float(term.loss.detach()))
        self._penalty_log[f"train/coef_{term.name}"].append(float(term.coef))

    def _record_regularizer_logs(self) -> None:
        logger: Any = self.logger  # type: ignore[attr-defined]
        for key, values in self._penalty_log.items():
            logger.record(key, float(np.mean(values)))
        self._penalty_log.clear()
        for reg in self.regularizers:
            for key, value in reg.logs().items():
                logger.record(f"train/{key}", value)
