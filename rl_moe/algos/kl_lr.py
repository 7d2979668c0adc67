"""A learning rate that follows each minibatch's KL: the rule SBX's PPO runs when ``target_kl``
is set, and so the SPHERE authors' HumanoidBench script (``+agent.target_kl=0.03``).

SBX (``sbx/common/utils.py``, ``KlAdaptiveLR``, after rsl_rl) divides the rate by ``factor`` when a
minibatch's approximate KL exceeds ``target_kl * margin``, multiplies it by ``factor`` when the KL
is below ``target_kl / margin``, and clips it to [``min_lr``, ``max_lr``] after every minibatch;
the new rate applies to actor and critic from the next minibatch on. It replaces the linear
schedule and does not stop an update early (SB3's ``target_kl`` does; this rule does not).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KLAdaptiveLR:
    """The KL-adaptive learning-rate rule (SBX's defaults).

    :param target_kl: the KL the rule steers toward
    :param margin: no change while target_kl / margin <= KL <= target_kl * margin
    :param factor: the rate is divided or multiplied by this
    :param min_lr: lower bound of the rate
    :param max_lr: upper bound of the rate
    """

    target_kl: float
    margin: float = 2.0
    factor: float = 1.5
    min_lr: float = 1e-5
    max_lr: float = 1e-2

    def __post_init__(self) -> None:
        if not self.target_kl > 0:
            raise ValueError(f"target_kl must be > 0, got {self.target_kl}")
        if not (self.margin >= 1 and self.factor >= 1 and 0 < self.min_lr <= self.max_lr):
            raise ValueError(f"need margin >= 1, factor >= 1 and 0 < min_lr <= max_lr, got {self}")

    def next_lr(self, lr: float, kl: float) -> float:
        """The rate after a minibatch whose approximate KL was ``kl``, starting from ``lr``."""
        if kl > self.target_kl * self.margin:
            lr = lr / self.factor
        elif kl < self.target_kl / self.margin:
            lr = lr * self.factor
        return min(max(lr, self.min_lr), self.max_lr)
