"""PPO whose loss is the clipped PPO objective plus named regularizer terms.

Same update as stable-baselines3's PPO (Schulman et al. 2017, arXiv:1707.06347), run by
:class:`~rl_moe.algos.update.PPOUpdate`, whose minibatch step reads top to bottom
(:meth:`~rl_moe.algos.update.PPOUpdate.step`); the only change to the maths is
:func:`~rl_moe.algos.backward.regularized_backward`, which adds the regularizer terms. This class
holds the settings, the rollouts and the choice of update path.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any, Sequence

from stable_baselines3 import PPO
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecEnv
from torch import Tensor

from rl_moe.algos.clipping import GRAD_CLIPS
from rl_moe.algos.common import RegularizedMixin
from rl_moe.algos.kl_lr import KLAdaptiveLR
from rl_moe.algos.update import FAST_MODES, PPOUpdate, no_distribution_checks, update_unsupported_reason
from rl_moe.regularizers.hooks import Regularizer
from rl_moe.algos.rollout import DeviceRolloutBuffer, GraphedActing, acting_unsupported_reason
from rl_moe.nn.reuse import weights_fixed
from rl_moe.nn.static import static_shapes


class MoEPPO(RegularizedMixin, PPO):
    """SB3 PPO with regularizer hooks.

    A rollout holds a :func:`~rl_moe.nn.reuse.weights_fixed` scope open, so its callbacks must
    not write weights other than in place through ordinary tensor ops (``load_state_dict``,
    ``copy_``): a ``.data`` write or a fused optimizer step is seen from the next rollout on.

    :param policy: policy class or name (e.g. :class:`~rl_moe.policies.MoEActorCriticPolicy`)
    :param env: environment
    :param regularizers: objects implementing :class:`~rl_moe.regularizers.Regularizer`
    :param fast_update: ``auto`` (default): the update's device minibatches of :mod:`rl_moe.algos.update`
        (static MoE shapes, CUDA graphs) and the rollouts of :mod:`rl_moe.algos.rollout` (one device
        read per env step) on CUDA when the run supports them, else SB3's minibatches and
        rollouts; ``on``: also on a CPU (eager); ``off``: always SB3's
    :param cuda_graphs: with device minibatches on CUDA, replay each minibatch step, and each
        rollout step's policy call, from a CUDA graph
    :param grad_clip: ``joint`` (SB3's: one norm over the whole policy) or ``separate`` (the actor's
        and the critic's gradients each clipped to ``max_grad_norm``, as the SPHERE authors' code);
        see :mod:`rl_moe.algos.clipping`
    :param kl_lr: a learning rate that follows each minibatch's KL (SBX's ``target_kl``,
        :mod:`rl_moe.algos.kl_lr`) in place of ``learning_rate``'s schedule; None: the schedule
    :param kwargs: any :class:`stable_baselines3.PPO` argument
    """

    def __init__(
        self,
        policy: Any,
        env: Any,
        regularizers: Sequence[Regularizer] = (),
        fast_update: str = "auto",
        cuda_graphs: bool = True,
        grad_clip: str = "joint",
        kl_lr: KLAdaptiveLR | None = None,
        **kwargs: Any,
    ) -> None:
        if fast_update not in FAST_MODES:
            raise ValueError(f"unknown fast_update {fast_update!r}; valid choices: {', '.join(FAST_MODES)}")
        if grad_clip not in GRAD_CLIPS:
            raise ValueError(f"unknown grad_clip {grad_clip!r}; valid choices: {', '.join(GRAD_CLIPS)}")
        self.grad_clip = grad_clip
        self.kl_lr = kl_lr
        #: Called with (epoch, n_epochs) as each epoch of an update begins (a progress display).
        self.on_epoch: Callable[[int, int], None] | None = None
        self.fast_update, self.cuda_graphs = fast_update, cuda_graphs
        self._update: PPOUpdate | None = None
        self._acting: GraphedActing | None = None
        self._init_regularizers(regularizers)
        # SB3's extension point: values and log-probabilities stay on the device during a rollout.
        kwargs.setdefault("rollout_buffer_class", DeviceRolloutBuffer)
        super().__init__(policy, env, **kwargs)

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "_update", "_acting", "on_epoch"]

    def fast_path_reason(self) -> str | None:
        """Why this learner's update takes SB3's minibatches rather than the sync-free device path
        (None when it takes the device path); the one place that rule lives."""
        if self.fast_update == "off":
            return "fast_update='off'"
        if self.fast_update == "auto" and self.device.type != "cuda":
            return f"device {self.device.type} (fast_update='auto' uses it on cuda only)"
        return update_unsupported_reason(self)

    def _updater(self) -> PPOUpdate:
        """The learner's update, built once per policy, optimizer and minibatch source
        (:meth:`fast_path_reason` picks the source; a network that grows gets a new optimizer,
        :mod:`rl_moe.policies.structure`)."""
        current = self._update
        fast = self.fast_path_reason() is None
        stale = current is None or current.algo.policy is not self.policy or current.optimizer is not self.policy.optimizer
        if stale or current.device_batches != fast:
            current = PPOUpdate(self, cuda_graphs=self.cuda_graphs, static=None if fast else False, device_batches=fast)
            self._update = current
        return current

    def _fast_updater(self) -> PPOUpdate | None:
        """The update when it takes device batches (the sync-free path), else None."""
        update = self._updater()
        return update if update.device_batches else None

    def _acting_graph(self) -> GraphedActing | None:
        """The graphed policy call of the rollouts, where the update takes device minibatches
        and the spaces allow it (a graph is only captured on CUDA)."""
        if self._fast_updater() is None or acting_unsupported_reason(self) is not None:
            self._acting = None
            return None
        if self._acting is None or self._acting.algo.policy is not self.policy:
            self._acting = GraphedActing(self, cuda_graphs=self.cuda_graphs)
        return self._acting

    def collect_rollouts(self, env: VecEnv, callback: BaseCallback, rollout_buffer: RolloutBuffer, n_rollout_steps: int) -> bool:
        self.flush_update_logs()
        fast, acting = self._fast_updater(), self._acting_graph()
        # Acting without the distribution's argument check on every step (a host sync; on a CPU
        # about 5% of a policy call at batch 8): the learner's NaN guard checks the weights once
        # per update instead, as for the update's own distributions. No weight is written during a
        # rollout, so its calls share the values of the weights alone (rl_moe.nn.reuse).
        if fast is None:
            with no_distribution_checks(), weights_fixed():
                running = super().collect_rollouts(env, callback, rollout_buffer, n_rollout_steps)
        else:
            # With static MoE shapes where the update uses them (a handful of states per step:
            # sorting rows costs more than it saves).
            with no_distribution_checks(), weights_fixed(), static_shapes(fast.static), acting.installed() if acting else nullcontext():
                running = super().collect_rollouts(env, callback, rollout_buffer, n_rollout_steps)
        if isinstance(rollout_buffer, DeviceRolloutBuffer):  # also a rollout a callback stopped
            rollout_buffer.flush()
        return running

    def flush_update_logs(self) -> None:
        """Write the last update's pending ``train/*`` at the step it ran (before the next
        rollout's callbacks log at that step), so each tag is written once per update."""
        if self.logger.name_to_value:
            self.logger.dump(self.num_timesteps)

    def train(self) -> None:
        self._updater().train()
