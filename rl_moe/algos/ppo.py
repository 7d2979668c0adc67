"""PPO whose loss is the clipped PPO objective plus named regularizer terms.

Same update as stable-baselines3's PPO (Schulman et al. 2017, arXiv:1707.06347); the only change
is :meth:`RegularizedMixin._backward`, which adds the regularizer terms.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecEnv
from stable_baselines3.common.utils import explained_variance

from rl_moe.algos.common import RegularizedMixin
from rl_moe.algos.ppo_loss import ppo_losses
from rl_moe.algos.fast import FAST_MODES, FastPPOUpdate, no_distribution_checks, unsupported_reason
from rl_moe.algos.rollout import DeviceRolloutCollector, unsupported_reason as rollout_unsupported
from rl_moe.nn.static import static_shapes
from rl_moe.algos.hooks import Regularizer


class MoEPPO(RegularizedMixin, PPO):
    """SB3 PPO with regularizer hooks.

    :param policy: policy class or name (e.g. :class:`~rl_moe.policies.MoEActorCriticPolicy`)
    :param env: environment
    :param regularizers: objects implementing :class:`~rl_moe.regularizers.Regularizer`
    :param fast_update: ``auto`` (default): the sync-free update of :mod:`rl_moe.algos.fast` (static
        MoE shapes, CUDA graphs) and the rollouts of :mod:`rl_moe.algos.rollout` (one device read
        per env step) on CUDA when the run supports them, else SB3's; ``on``:
        also on a CPU (eager); ``off``: always the standard update
    :param cuda_graphs: with the fast update on CUDA, replay each minibatch step, and each rollout
        step's policy call, from a CUDA graph
    :param kwargs: any :class:`stable_baselines3.PPO` argument
    """

    def __init__(
        self,
        policy: Any,
        env: Any,
        regularizers: Sequence[Regularizer] = (),
        fast_update: str = "auto",
        cuda_graphs: bool = True,
        **kwargs: Any,
    ) -> None:
        if fast_update not in FAST_MODES:
            raise ValueError(f"unknown fast_update {fast_update!r}; valid choices: {', '.join(FAST_MODES)}")
        self.fast_update, self.cuda_graphs = fast_update, cuda_graphs
        self._fast: FastPPOUpdate | None = None
        self._collector: DeviceRolloutCollector | None = None
        self._init_regularizers(regularizers)
        super().__init__(policy, env, **kwargs)

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "_fast", "_collector"]

    def fast_path_reason(self) -> str | None:
        """Why this learner runs the standard update (None when it runs the fast one)."""
        if self.fast_update == "off":
            return "fast_update='off'"
        if self.fast_update == "auto" and self.device.type != "cuda":
            return f"device {self.device.type} (fast_update='auto' uses it on cuda only)"
        return unsupported_reason(self)

    def _fast_updater(self) -> FastPPOUpdate | None:
        if self.fast_path_reason() is not None:
            self._fast = None
            return None
        if self._fast is None or self._fast.algo.policy is not self.policy:
            self._fast = FastPPOUpdate(self, cuda_graphs=self.cuda_graphs)
        return self._fast

    def _rollout_collector(self) -> DeviceRolloutCollector | None:
        """The device-resident collector where the fast update runs and the spaces allow it."""
        if self._fast_updater() is None or rollout_unsupported(self) is not None:
            self._collector = None
            return None
        size = (self.rollout_buffer.buffer_size, self.rollout_buffer.n_envs)
        current = self._collector
        if current is None or current.algo.policy is not self.policy or tuple(current.values.shape) != size:
            self._collector = DeviceRolloutCollector(self, cuda_graphs=self.cuda_graphs)
        return self._collector

    def collect_rollouts(self, env: VecEnv, callback: BaseCallback, rollout_buffer: RolloutBuffer, n_rollout_steps: int) -> bool:
        self.flush_update_logs()
        fast, collector = self._fast_updater(), self._rollout_collector()
        if fast is None:
            return super().collect_rollouts(env, callback, rollout_buffer, n_rollout_steps)
        # Acting without a host sync per distribution check, and with static MoE shapes where
        # the update uses them (a handful of states per step: sorting rows costs more than it saves).
        with no_distribution_checks(), static_shapes(fast.static):
            if collector is None:
                return super().collect_rollouts(env, callback, rollout_buffer, n_rollout_steps)
            return collector.collect(env, callback, rollout_buffer, n_rollout_steps)

    def flush_update_logs(self) -> None:
        """Write the last update's pending ``train/*`` at the step it ran (before the next
        rollout's callbacks log at that step), so each tag is written once per update."""
        if self.logger.name_to_value:
            self.logger.dump(self.num_timesteps)

    def train(self) -> None:
        fast = self._fast_updater()
        if fast is not None:
            fast.train()
        else:
            # Non-finite weights flow into the logged means, where the NaN guard names the term,
            # instead of failing a distribution's argument check mid-update.
            with no_distribution_checks():
                self._train_standard()

    def _train_standard(self) -> None:
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        clip_range = self.clip_range(self._current_progress_remaining)  # type: ignore[operator]
        clip_range_vf = None if self.clip_range_vf is None else self.clip_range_vf(self._current_progress_remaining)  # type: ignore[operator]
        entropy_losses, pg_losses, value_losses, clip_fractions = [], [], [], []
        approx_kl_divs: list[float] = []
        continue_training = True
        loss = torch.zeros(())
        for epoch in range(self.n_epochs):
            approx_kl_divs = []
            for batch in self.rollout_buffer.get(self.batch_size):
                losses = ppo_losses(self, batch, clip_range, clip_range_vf)
                pg_losses.append(losses.policy.item())
                value_losses.append(losses.value.item())
                entropy_losses.append(losses.entropy.item())
                clip_fractions.append(losses.clip_fraction(clip_range).item())
                approx_kl_div = losses.approx_kl().item()
                approx_kl_divs.append(approx_kl_div)
                if self.target_kl is not None and approx_kl_div > 1.5 * self.target_kl:
                    continue_training = False
                    if self.verbose >= 1:
                        print(f"Early stopping at epoch {epoch}: approx KL {approx_kl_div:.2f}")
                    break

                self.policy.optimizer.zero_grad()
                loss = self._backward(losses.context(self, batch), losses.actor, self.vf_coef * losses.value, self.policy.parameters())
                torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
                self.policy.optimizer.step()
                self._after_update("ppo")
            self._n_updates += 1
            if not continue_training:
                break

        explained_var = explained_variance(self.rollout_buffer.values.flatten(), self.rollout_buffer.returns.flatten())
        self.logger.record("train/entropy_loss", np.mean(entropy_losses))
        self.logger.record("train/policy_gradient_loss", np.mean(pg_losses))
        self.logger.record("train/value_loss", np.mean(value_losses))
        self.logger.record("train/approx_kl", np.mean(approx_kl_divs))
        self.logger.record("train/clip_fraction", np.mean(clip_fractions))
        self.logger.record("train/loss", loss.item())
        self.logger.record("train/explained_variance", explained_var)
        if hasattr(self.policy, "log_std"):  # as SB3: only Gaussian policies have a log-std
            self.logger.record("train/std", torch.exp(self.policy.log_std).mean().item())
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/clip_range", clip_range)
        if clip_range_vf is not None:
            self.logger.record("train/clip_range_vf", clip_range_vf)
        self._record_regularizer_logs()
