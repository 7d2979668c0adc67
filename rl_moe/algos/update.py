"""The PPO update of :class:`rl_moe.algos.MoEPPO`: one loop on every device (:class:`PPOUpdate`).

SB3's PPO (Schulman et al. 2017) plus the regularizer terms. Losses, clip fractions, KL and the
regularizer terms are summed in tensors and read once per update (``target_kl``, when set, once
per epoch). The minibatches come from one of two sources:

- **SB3's** ``RolloutBuffer.get`` (CPU, and wherever the sync-free path cannot run): the same
  minibatches in the same order as SB3, so ``MoEPPO(regularizers=[])`` is SB3's PPO bit for bit;
- **the device** (``fast_update``), arranged so that the GPU never waits for Python:

- the rollout is copied to the device once per update, into buffers allocated once;
- each epoch draws its permutation on the device, and a minibatch is a gather by a device index;
- MoE layers run in the static-shape layout (:mod:`rl_moe.nn.static`): every expert in one batched
  matmul, weighted by the routing, with no ``nonzero``/``tolist``;
- losses, clip fractions, KL and the regularizer terms are summed on the device and read once;
- learning rate and clip range are device tensors refreshed once per update, the optimizer is a
  capturable Adam, so on CUDA the whole minibatch step (forward, PPO loss, regularizers including
  SPHERE's adaptive-lambda extra backward, clipping, Adam) is captured once as a CUDA graph and
  replayed for every minibatch.

``MoEPPO(..., fast_update="auto")`` takes the device source on CUDA when everything in the update
supports it (:func:`update_unsupported_reason`) and SB3's otherwise; ``"on"`` also takes it on a CPU
(eagerly, without graphs), ``"off"`` never. A CUDA graph wraps the same minibatch step
(:class:`~rl_moe.algos.graphs.GraphedStep` around :meth:`PPOUpdate.step_index`); it is not a second
implementation.

``target_kl`` stops after the epoch whose mean KL exceeds 1.5 x ``target_kl``. SB3 stops in the
middle of that epoch, before the minibatch that exceeded it, which needs a host read per
minibatch; the epochs before are the same.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.type_aliases import RolloutBufferSamples
from stable_baselines3.common.utils import explained_variance
from torch import Tensor

from rl_moe.algos.backward import regularized_backward
from rl_moe.algos.clipping import clip_gradients, split_actor_critic
from rl_moe.algos.common import DeviceTermLog, after_step, record_update_logs
from rl_moe.algos.graphs import GraphedStep, StateOps
from rl_moe.algos.learner import PPOLearner
from rl_moe.algos.ppo_loss import ppo_losses
from rl_moe.algos.rollout import DeviceRolloutBuffer
from rl_moe.maths import grads_norm
from rl_moe.nn.static import static_shapes

#: ``fast_update`` choices.
FAST_MODES: tuple[str, ...] = ("auto", "on", "off")
#: Columns of the per-update statistics accumulated on the device.
_STATS = ("policy_gradient_loss", "value_loss", "entropy_loss", "clip_fraction", "grad_norm_actor", "grad_norm_critic")


@contextmanager
def no_distribution_checks() -> Iterator[None]:
    """Skip torch.distributions' argument validation, a host sync per distribution built.

    The check only guards against non-finite parameters; the learner's NaN guard does that once
    per update instead.
    """
    previous = torch.distributions.Distribution._validate_args
    torch.distributions.Distribution.set_default_validate_args(False)
    try:
        yield
    finally:
        torch.distributions.Distribution.set_default_validate_args(previous)


def update_unsupported_reason(algo: PPOLearner) -> str | None:
    """Why the sync-free update cannot run this learner (None when it can)."""
    if type(algo.rollout_buffer) not in (RolloutBuffer, DeviceRolloutBuffer):
        return f"rollout buffer {type(algo.rollout_buffer).__name__} (only RolloutBuffer, DeviceRolloutBuffer)"
    if algo.use_sde:
        return "gSDE exploration"
    if getattr(algo, "kl_lr", None) is not None:
        return "the KL-adaptive learning rate reads every minibatch's KL"
    unsafe = [reg.name for reg in algo.regularizers if not reg.graph_safe]
    if unsafe:
        return f"regularizers {', '.join(unsafe)} need host reads"
    return None


@dataclass
class _Rollout:
    """The rollout flattened as SB3's ``RolloutBuffer.get`` does, resident on the device."""

    obs: Tensor  # (T, *obs_shape)
    actions: Tensor  # (T, act_dim)
    old_values: Tensor  # (T,)
    old_log_prob: Tensor  # (T,)
    advantages: Tensor  # (T,)
    returns: Tensor  # (T,)

    @staticmethod
    def arrays(buffer: RolloutBuffer) -> tuple[Any, ...]:
        return buffer.observations, buffer.actions, buffer.values, buffer.log_probs, buffer.advantages, buffer.returns

    @classmethod
    def allocate(cls, buffer: RolloutBuffer, device: torch.device) -> "_Rollout":
        return cls(*(torch.empty(_flat_shape(a), dtype=torch.float32, device=device) for a in cls.arrays(buffer)))

    def fill(self, buffer: RolloutBuffer) -> None:
        """One host-to-device copy per array (SB3's swap_and_flatten: env-major rows)."""
        for dst, src in zip(self.tensors(), self.arrays(buffer)):
            host = torch.from_numpy(src).transpose(0, 1).reshape(dst.shape)
            dst.copy_(host.to(torch.float32), non_blocking=False)

    def tensors(self) -> tuple[Tensor, ...]:
        return self.obs, self.actions, self.old_values, self.old_log_prob, self.advantages, self.returns


def _flat_shape(array: Any) -> tuple[int, ...]:
    """(n_steps, n_envs, *rest) -> (n_envs * n_steps, *rest); per-step scalars become (T,)."""
    shape = array.shape
    return (shape[0] * shape[1], *shape[2:])


def _forget_distribution(policy: ActorCriticPolicy) -> None:
    """Drop SB3's action distribution of the policy's last forward (it holds the mean actions).

    One made with gradients outside the capture (by the plasticity probe's actor gradient, say)
    keeps autograd's per-parameter accumulators alive on the default stream; the captured
    backward would then wait on that stream, which invalidates the capture. (The MoE outputs are
    returned to the caller, never kept on the policy.)
    """
    policy.action_dist.distribution = None  # type: ignore[attr-defined]  # every SB3 Distribution has it


def weight_change(before: list[Tensor], after: Any) -> float:
    """||theta_after - theta_before|| / ||theta_before|| over all parameters: the relative weight
    change of one update, as the Plasticine benchmark reports it (one device read)."""
    diff = grads_norm(a.detach() - b for a, b in zip(after, before))
    return float(diff / grads_norm(before).clamp_min(1e-12))


class PPOUpdate:
    """The update of one :class:`~rl_moe.algos.MoEPPO` learner (see the module docstring).

    :param algo: the learner
    :param cuda_graphs: capture the minibatch step as a CUDA graph (CUDA, device batches only)
    :param static: static-shape MoE layers (default: on CUDA only, where they are faster)
    :param device_batches: minibatches gathered on the device (the sync-free path); False: SB3's
    """

    def __init__(self, algo: PPOLearner, cuda_graphs: bool = True, static: bool | None = None, device_batches: bool = True) -> None:
        self.algo = algo
        self.device = algo.device
        self.device_batches = device_batches
        self.cuda_graphs = cuda_graphs and device_batches and self.device.type == "cuda"
        self.static = self.device.type == "cuda" if static is None else static
        if self.cuda_graphs and not self.static:
            raise ValueError("CUDA graphs need static-shape MoE layers; got static=False")
        self.rollout = _Rollout.allocate(algo.rollout_buffer, self.device) if device_batches else None
        self.split = split_actor_critic(algo.policy)  # the clipping rule's sides, taken once per policy
        self.optimizer = algo.policy.optimizer  # the parameters it was taken over (a grown network gets a new one)
        self.terms = DeviceTermLog()
        self.stats = torch.zeros(len(_STATS), device=self.device)  # summed over the update
        self.kl = torch.zeros((), device=self.device)  # summed over the current epoch
        self.total = torch.zeros((), device=self.device)  # the last minibatch's total loss
        #: tr(A_last) of the actor's routed features in the last minibatch (SPHERE's features; NaN
        #: until an expert network has run): every MoE run's control curve beside train/sphere_trace
        self.feature_trace = torch.full((), float("nan"), device=self.device)
        self.clip_range = torch.zeros((), device=self.device)
        self.clip_range_vf = torch.zeros((), device=self.device)
        #: Minibatch order of an epoch: (rows, device) -> (rows,) long on the device. Tests swap in
        #: SB3's numpy permutation to compare with SB3's minibatches one by one.
        self.permutation = lambda n, device: torch.randperm(n, device=device)
        #: The minibatch step on device indices, replayed from CUDA graphs where they run.
        self.graphed = GraphedStep(
            "PPO update", self.step_index, StateOps(self._snapshot, self._restore, self._weights), self._current_key,
            before_capture=lambda: _forget_distribution(algo.policy), enabled=self.cuda_graphs,
        )  # fmt: skip
        if self.cuda_graphs:
            self._make_capturable()

    # --- one update ---------------------------------------------------------------------------

    def train(self) -> None:
        """One PPO update over the rollout buffer (``MoEPPO.train``)."""
        algo = self.algo
        algo.policy.set_training_mode(True)
        if algo.kl_lr is None:
            lr = algo.lr_schedule(algo._current_progress_remaining)
            self._set_learning_rate(lr)
        clip_range = float(algo.clip_range(algo._current_progress_remaining))  # type: ignore[operator]
        clip_range_vf = None if algo.clip_range_vf is None else float(algo.clip_range_vf(algo._current_progress_remaining))  # type: ignore[operator]
        self.clip_range.fill_(clip_range)
        self.clip_range_vf.fill_(0.0 if clip_range_vf is None else clip_range_vf)
        if self.rollout is not None:
            self.rollout.fill(algo.rollout_buffer)
        self.stats.zero_()
        self.terms.zero_()
        before = [p.detach().clone() for p in algo.policy.parameters()]  # for train/weight_change
        n_minibatches = 0
        last_epoch_batches = 0
        for epoch in range(algo.n_epochs):
            if algo.on_epoch is not None:
                algo.on_epoch(epoch, algo.n_epochs)
            self.kl.zero_()
            last_epoch_batches = 0
            for batch in self._minibatches():
                self._run_minibatch(batch, (clip_range, clip_range_vf))
                after_step(algo, "ppo")
                n_minibatches += 1
                last_epoch_batches += 1
            algo._n_updates += 1
            if algo.target_kl is not None:
                kl = float(self.kl) / max(last_epoch_batches, 1)  # the one read of the epoch
                if kl > 1.5 * algo.target_kl:
                    if algo.verbose >= 1:
                        print(f"Early stopping after epoch {epoch}: approx KL {kl:.2f}")
                    break
        if algo.kl_lr is not None:  # the rate the next update starts from
            lr = self.learning_rate()
            algo.logger.record("train/learning_rate", lr)
        self._log(lr, clip_range, clip_range_vf, n_minibatches, last_epoch_batches)
        algo.logger.record("train/weight_change", weight_change(before, algo.policy.parameters()))

    def _minibatches(self) -> Iterator[Tensor | RolloutBufferSamples]:
        """One epoch's minibatches: device row indices, or SB3's samples in SB3's order."""
        if self.rollout is None:
            yield from self.algo.rollout_buffer.get(self.algo.batch_size)
            return
        n_rows = self.rollout.old_values.shape[0]
        perm = self.permutation(n_rows, self.device)
        for start in range(0, n_rows, self.algo.batch_size):
            yield perm[start : start + self.algo.batch_size]

    def _run_minibatch(self, batch: Tensor | RolloutBufferSamples, host_clip: tuple[float, float | None]) -> None:
        """One step on SB3's samples (with the clip ranges as floats, as SB3 passes them) or on
        device row indices (:attr:`graphed`: eager, or replayed from the minibatch's CUDA graph)."""
        if isinstance(batch, Tensor):
            self.graphed(batch)
        else:
            self.step(batch, *host_clip, sync_free=False)

    def step_index(self, index: Tensor) -> None:
        """:meth:`step` on the rows ``index`` (a device tensor) of the device rollout, with the
        clip ranges as device tensors: what a CUDA graph captures."""
        assert self.rollout is not None
        batch = RolloutBufferSamples(*(t[index] for t in self.rollout.tensors()))
        self.step(batch, self.clip_range, None if self.algo.clip_range_vf is None else self.clip_range_vf, sync_free=True)

    def step(self, batch: RolloutBufferSamples, clip_range: float | Tensor, clip_range_vf: float | Tensor | None, sync_free: bool) -> None:
        """Forward, PPO loss, regularizer terms, backward, clipping and the optimizer step of one
        minibatch; statistics are added to the sums.

        :param sync_free: tell the regularizers that nothing may read the device (device batches)
        """
        algo = self.algo
        policy = algo.policy
        with static_shapes(self.static), no_distribution_checks():
            losses = ppo_losses(algo, batch, clip_range, clip_range_vf)
            trace = None if losses.actor_output is None else losses.actor_output.feature_trace()
            if trace is not None:  # the features the step starts from; a copy, no host read
                self.feature_trace.copy_(trace)
            policy.optimizer.zero_grad(set_to_none=True)
            ctx = losses.context(algo, batch, sync_free=sync_free)
            total = regularized_backward(algo.regularizers, ctx, losses.actor, algo.vf_coef * losses.value, policy.parameters(), self.terms)
        norms = clip_gradients(policy, algo.grad_clip, algo.max_grad_norm, self.split)  # (2,) actor, critic before clipping
        policy.optimizer.step()
        with torch.no_grad():
            kl = losses.approx_kl()
            self.kl.add_(kl)
            if algo.kl_lr is not None:  # a host read per minibatch (the update takes SB3's minibatches)
                self._set_learning_rate(algo.kl_lr.next_lr(self.learning_rate(), float(kl)), record=False)
            terms = (losses.policy, losses.value, losses.entropy, losses.clip_fraction(clip_range))
            self.stats.add_(torch.cat([torch.stack(terms).detach(), norms.detach().to(self.stats.dtype)]))
            self.total.copy_(total)

    # --- CUDA graphs (:attr:`graphed` captures :meth:`step_index`) ------------------------------

    def _current_key(self) -> tuple[Any, ...]:
        """What a captured graph bakes in: when any of it changes, the graphs are captured again."""
        algo = self.algo
        return (
            id(algo.policy), id(algo.policy.optimizer), algo.ent_coef, algo.vf_coef, algo.max_grad_norm, algo.grad_clip,
            algo.normalize_advantage, algo.clip_range_vf is None, tuple(id(r) for r in algo.regularizers),
        )  # fmt: skip

    def _make_capturable(self) -> None:
        """Adam with device step counters and a device learning rate, so a graph can replay it."""
        opt = self.algo.policy.optimizer
        for group in opt.param_groups:
            if "capturable" in group:
                group["capturable"] = True
            if not isinstance(group["lr"], Tensor):
                group["lr"] = torch.tensor(float(group["lr"]), device=self.device)
        for state in opt.state.values():
            if "step" in state and isinstance(state["step"], Tensor):
                state["step"] = state["step"].to(self.device, torch.float32)

    def learning_rate(self) -> float:
        """The optimizer's current rate (its first group's; every group shares it)."""
        return float(self.algo.policy.optimizer.param_groups[0]["lr"])

    def _set_learning_rate(self, lr: float, record: bool = True) -> None:
        if record:
            self.algo.logger.record("train/learning_rate", lr)
        for group in self.algo.policy.optimizer.param_groups:
            if isinstance(group["lr"], Tensor):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr

    def _snapshot(self) -> tuple[list[tuple[Tensor, Tensor]], list[Tensor]]:
        """(live tensor, copy) of every tensor a step writes, and the parameters without Adam
        state yet (a step creates theirs; restoring zeroes it, as a fresh Adam state is)."""
        opt = self.algo.policy.optimizer
        live: list[Tensor] = [p.data for p in self.algo.policy.parameters()]
        live += [self.stats, self.kl, self.total, *self.terms.sums.values()]
        pairs = [(t, t.detach().clone()) for t in live]
        pairs += [(v, v.detach().clone()) for s in opt.state.values() for v in s.values() if isinstance(v, Tensor)]
        fresh = [p for p in self.algo.policy.parameters() if p not in opt.state or not opt.state[p]]
        return pairs, fresh

    def _restore(self, saved: tuple[list[tuple[Tensor, Tensor]], list[Tensor]]) -> None:
        pairs, fresh = saved
        with torch.no_grad():
            for live, copy in pairs:
                live.copy_(copy)
            opt = self.algo.policy.optimizer
            for p in fresh:
                for v in opt.state.get(p, {}).values():
                    if isinstance(v, Tensor):
                        v.zero_()
            self.terms.zero_()

    def _weights(self) -> list[Tensor]:
        """What a replay is checked on: the policy's weights after the step."""
        return [p.detach() for p in self.algo.policy.parameters()]

    # --- logging ------------------------------------------------------------------------------

    def _log(self, lr: float, clip_range: float, clip_range_vf: float | None, n_minibatches: int, last_epoch: int) -> None:
        algo = self.algo
        logger = algo.logger
        # The one read of the update: statistics, KL, total loss and the regularizer sums.
        head = torch.cat([self.stats / max(n_minibatches, 1), (self.kl / max(last_epoch, 1))[None], self.total[None], self.feature_trace[None]])
        values = head.cpu().tolist()
        for name, value in zip(_STATS, values):
            logger.record(f"train/{name}", value)
        logger.record("train/approx_kl", values[len(_STATS)])
        logger.record("train/loss", values[len(_STATS) + 1])
        if not math.isnan(values[len(_STATS) + 2]):  # NaN: the actor has no expert stacks
            logger.record("train/feature_trace", values[len(_STATS) + 2])

        buffer = algo.rollout_buffer
        logger.record("train/explained_variance", explained_variance(buffer.values.flatten(), buffer.returns.flatten()))
        if hasattr(algo.policy, "log_std"):  # as SB3: only Gaussian policies have a log-std
            logger.record("train/std", torch.exp(algo.policy.log_std).mean().item())
        logger.record("train/n_updates", algo._n_updates, exclude="tensorboard")
        logger.record("train/clip_range", clip_range)
        if clip_range_vf is not None:
            logger.record("train/clip_range_vf", clip_range_vf)
        # Device batches: one addition per minibatch, which a replayed graph does not count; SB3's
        # batches run eagerly, so each term's own count holds (a term some minibatches skip).
        record_update_logs(algo, self.terms.means(n_minibatches if self.device_batches else None))
