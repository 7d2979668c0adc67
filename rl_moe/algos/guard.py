"""The NaN/inf guard: a learner stops at the first non-finite loss term, gradient or weight.

Checked once per update, after the update has logged its means (the values are already on the
host then) plus one device reduction over the parameters and their gradients: no extra host read
per minibatch. A non-finite gradient norm shows up as non-finite gradients or, after the optimizer
step, non-finite weights, so the parameter check covers it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn


class NonFiniteError(RuntimeError):
    """Training produced a NaN or infinite value.

    :param tag: what became non-finite (a logged tag such as ``train/loss_sphere``, or
        ``policy parameters``)
    :param value: the offending value (``nan``, ``inf`` or ``-inf``)
    """

    def __init__(self, tag: str, value: float) -> None:
        super().__init__(f"{tag} became {value}")
        self.tag, self.value = tag, value


#: Base loss terms in the order the learners build the loss, after the regularizer terms (which
#: are computed from the forward pass alone, before any base term touches them).
BASE_TERMS = ("policy_gradient_loss", "actor_loss", "value_loss", "critic_loss", "entropy_loss")


def _build_order(tag: str) -> int:
    """Where ``tag``'s term enters the loss: regularizer terms (``loss_<reg>``, ``coef_<reg>``)
    first, then the base terms of :data:`BASE_TERMS`, then everything derived from them."""
    name = tag.split("/", 1)[-1]
    if name.startswith(("loss_", "coef_")):
        return 0
    return 1 + BASE_TERMS.index(name) if name in BASE_TERMS else 1 + len(BASE_TERMS)


def first_non_finite(values: Mapping[str, Any], prefix: str = "train/") -> tuple[str, float] | None:
    """The first ``(tag, value)`` under ``prefix`` that is a non-finite number, or None.

    "First" is in the order the loss is built (:func:`_build_order`), not the logging order: a NaN
    penalty makes the next update's policy, value and entropy terms NaN too, and the message must
    name where it started. Ties keep the logging order.
    """
    ordered = sorted(values.items(), key=lambda kv: _build_order(kv[0]))  # stable
    for tag, value in ordered:
        if not tag.startswith(prefix) or isinstance(value, bool):
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if not math.isfinite(number):
            return tag, number
    return None


def parameters_finite(params: Iterable[nn.Parameter]) -> bool:
    """Whether every parameter and gradient is finite: one host read for the whole model.

    Each tensor is reduced to its min and max (NaN propagates into both, an infinity shows in
    one): a single read-only pass, ~10x faster on CPU than ``isfinite``, which writes a mask the
    size of the tensor. TD3 runs this after every gradient step, so it matters there.
    """
    extremes = []
    for p in params:
        if not p.numel():  # aminmax has nothing to reduce
            continue
        extremes.extend(torch.aminmax(p.detach()))
        if p.grad is not None:
            extremes.extend(torch.aminmax(p.grad))
    return bool(torch.stack(extremes).isfinite().all()) if extremes else True


def check_update(logged: Mapping[str, Any], params: Iterable[nn.Parameter]) -> None:
    """Raise :class:`NonFiniteError` when an update logged a non-finite ``train/*`` value or left
    non-finite weights or gradients behind.

    :param logged: the logger's pending values (``logger.name_to_value``)
    :param params: the learner's parameters
    """
    bad = first_non_finite(logged)
    if bad is not None:
        raise NonFiniteError(*bad)
    if not parameters_finite(params):
        raise NonFiniteError("policy parameters", math.nan)


def diagnose(exc: BaseException, params: Iterable[nn.Parameter]) -> NonFiniteError | None:
    """A :class:`NonFiniteError` when ``exc`` (raised inside an update or a rollout: a
    distribution's argument check, an ``eigh`` that does not converge) comes from non-finite
    weights; None when the weights are finite and ``exc`` is something else."""
    if isinstance(exc, NonFiniteError):
        return exc
    if isinstance(exc, (ValueError, RuntimeError)) and not parameters_finite(params):
        return NonFiniteError("policy parameters", math.nan)
    return None
