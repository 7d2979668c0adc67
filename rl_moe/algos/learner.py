"""What the PPO update paths need of a learner, as a type below all of them.

:class:`~rl_moe.algos.MoEPPO` implements it (SB3's ``PPO`` plus
:class:`~rl_moe.algos.common.RegularizedMixin`). The sync-free update (:mod:`rl_moe.algos.update`),
the device rollout (:mod:`rl_moe.algos.rollout`) and the loss (:mod:`rl_moe.algos.ppo_loss`) take
a :class:`PPOLearner`, so none of them imports ``ppo.py``, which imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
from gymnasium import spaces
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.policies import ActorCriticPolicy
from torch import device

from rl_moe.algos.kl_lr import KLAdaptiveLR
from rl_moe.regularizers.hooks import Regularizer


class PPOLearner(Protocol):
    """The PPO learner's settings and state that the update paths read or advance.

    The underscored names are SB3's own ``OnPolicyAlgorithm`` state (``_last_obs`` and the like).
    The update owns the arithmetic (backward, clipping, optimizer step), so nothing here is a
    method of ours.
    """

    policy: ActorCriticPolicy
    rollout_buffer: RolloutBuffer
    observation_space: spaces.Space
    action_space: spaces.Space
    logger: Logger
    device: device
    regularizers: list[Regularizer]
    # PPO settings (SB3 names; the clip ranges are schedules of the remaining progress)
    batch_size: int
    n_epochs: int
    gamma: float
    ent_coef: float
    vf_coef: float
    max_grad_norm: float
    grad_clip: str  # a key of rl_moe.algos.clipping.GRAD_CLIPS
    on_epoch: Callable[[int, int], None] | None  # told (epoch, n_epochs) as each epoch begins
    target_kl: float | None  # SB3's: stop an update early
    kl_lr: KLAdaptiveLR | None  # SBX's: a learning rate that follows each minibatch's KL
    normalize_advantage: bool
    use_sde: bool
    clip_range: Callable[[float], float]
    clip_range_vf: Callable[[float], float] | None
    lr_schedule: Callable[[float], float]
    # SB3 on-policy state
    num_timesteps: int
    _n_updates: int
    _current_progress_remaining: float
    _last_obs: np.ndarray | dict[str, np.ndarray]
    _last_episode_starts: np.ndarray

    def _update_info_buffer(self, infos: list[dict[str, Any]], dones: np.ndarray | None = None) -> None: ...
