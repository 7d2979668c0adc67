"""Regularizers: SPHERE and the plasticity baselines, in a registry by name."""

from rl_moe.regularizers.base import PHASES, LossContext, Penalty, Regularizer, grad_norm, grad_ratio_coef

__all__ = ["PHASES", "LossContext", "Penalty", "Regularizer", "grad_norm", "grad_ratio_coef"]
