"""The learners a run can train with, one :class:`AlgoSpec` each in :data:`LEARNERS`.

A spec holds everything that differs between PPO and TD3 for the rest of the package: the config
section and its checks, the policy and learner classes, which side carries the MoE by default,
how a task starts and how the step budget rounds. Nothing else branches on the algo's name.
The settings per env family (SPHERE appendix A.4, Table 2) are the presets in
:mod:`rl_moe.continual.presets`; every field can be changed from the CLI with
``--set ppo.n_steps=64`` and the like.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from stable_baselines3.common.noise import NormalActionNoise, VectorizedActionNoise

from rl_moe.algos import ALGOS
from rl_moe.algos.clipping import GRAD_CLIPS
from rl_moe.algos.kl_lr import KLAdaptiveLR
from rl_moe.algos.update import FAST_MODES
from rl_moe.errors import UsageError, check_choice, check_positive, check_within
from rl_moe.policies import MoEActorCriticPolicy, MoETD3Policy

#: ``(section, env, regularizers, common kwargs) -> learner``; ``common`` holds seed, device,
#: verbosity and the policy kwargs.
Builder = Callable[[Any, Any, list, dict], Any]
#: ``(model, section, global_step, steps_per_task) -> None``: learner-specific task start.
TaskStart = Callable[[Any, Any, int, int], None]


@dataclass(frozen=True)
class PPOConfig:
    """PPO settings (SPHERE Table 2).

    :param n_envs: parallel envs
    :param n_steps: rollout steps per env per update
    :param batch_size: minibatch size
    :param n_epochs: epochs per update
    :param gamma: discount
    :param gae_lambda: GAE lambda
    :param clip_range: PPO clip
    :param max_grad_norm: gradient clipping
    :param ent_coef: entropy coefficient
    :param vf_coef: value-loss coefficient
    :param lr_start: learning rate at the start of every task
    :param lr_end: learning rate reached after ``lr_decay_fraction`` of the task
    :param lr_decay_fraction: share of the task over which the rate decays linearly (HB: 0.5)
    :param normalize_obs: wrap envs in SB3 ``VecNormalize`` (HB: Table 2's "VecNormalize")
    :param normalize_reward: also scale rewards in ``VecNormalize`` (its default; on for HB)
    :param fast_update: the learner's sync-free update (:mod:`rl_moe.algos.update`) and rollouts
        (:mod:`rl_moe.algos.rollout`): ``auto`` (on CUDA), ``on`` (also on a CPU) or ``off`` (SB3's
        loops everywhere); same maths either way
    :param grad_clip: ``joint`` (SB3's one norm over actor and critic) or ``separate`` (each side to
        ``max_grad_norm`` on its own, as the SPHERE authors' code; :mod:`rl_moe.algos.clipping`)
    :param target_kl: None (default): the linear schedule above. A value: SBX's KL-adaptive
        learning rate in its place (:mod:`rl_moe.algos.kl_lr`), as the SPHERE authors'
        HumanoidBench script sets it (0.03): from ``lr_start`` at every task's start, divided or
        multiplied by 1.5 after each minibatch whose KL leaves [target/2, 2 target], within
        [1e-5, 1e-2]. It never stops an update early (SB3's ``target_kl`` does)
    """

    n_envs: int = 8
    n_steps: int = 2048
    batch_size: int = 256
    n_epochs: int = 10
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_range: float = 0.2
    max_grad_norm: float = 0.5
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    lr_start: float = 3e-4
    lr_end: float = 1e-4
    lr_decay_fraction: float = 1.0
    normalize_obs: bool = False
    normalize_reward: bool = False
    fast_update: str = "auto"
    grad_clip: str = "joint"
    target_kl: float | None = None


@dataclass(frozen=True)
class TD3Config:
    """TD3 settings. The paper's Table 2 covers PPO only; these follow SB3/Fujimoto et al. (2018).

    :param n_envs: parallel envs (1: one gradient step per env step, as in the TD3 paper)
    :param buffer_size: replay capacity; the buffer is emptied at every task boundary
    :param learning_starts: random-action warm-up steps at the start of *every* task
    :param batch_size: minibatch size
    :param tau: target-network Polyak rate
    :param gamma: discount
    :param train_freq: env steps between updates
    :param gradient_steps: gradient steps per update
    :param policy_delay: critic updates per actor update
    :param action_noise_std: std of the Gaussian exploration noise (actions in [-1, 1])
    :param target_policy_noise: target smoothing noise std
    :param target_noise_clip: target smoothing noise clip
    :param lr: Adam learning rate (constant)
    :param normalize_obs: wrap envs in SB3 ``VecNormalize`` (observations)
    :param normalize_reward: also scale rewards in ``VecNormalize``
    :param fast_update: static-shape MoE layers in the learner (:class:`rl_moe.algos.MoETD3`):
        ``auto`` (on CUDA), ``on`` or ``off``
    """

    n_envs: int = 1
    buffer_size: int = 1_000_000
    learning_starts: int = 10_000
    batch_size: int = 256
    tau: float = 0.005
    gamma: float = 0.99
    train_freq: int = 1
    gradient_steps: int = 1
    policy_delay: int = 2
    action_noise_std: float = 0.1
    target_policy_noise: float = 0.2
    target_noise_clip: float = 0.5
    lr: float = 1e-3
    normalize_obs: bool = False
    normalize_reward: bool = False
    fast_update: str = "auto"


@dataclass
class TaskLinearSchedule:
    """Learning rate decaying linearly from ``start`` to ``end`` over the first ``fraction`` of the
    *current task*, then held (SPHERE Table 2: over the task for MetaWorld, its first half for HB).

    SB3 passes ``progress_remaining = 1 - n / (task_start + task_steps)`` because tasks continue
    the global step count (``reset_num_timesteps=False``); this recovers the task-local progress.

    :param start: rate at the task's first step
    :param end: rate after ``fraction`` of the task
    :param fraction: share of the task over which the rate decays
    :param task_start: global step at which the task begins
    :param task_steps: steps of the task
    """

    start: float
    end: float
    fraction: float = 1.0
    task_start: int = 0
    task_steps: int = 1

    def __call__(self, progress_remaining: float) -> float:
        global_step = (1.0 - progress_remaining) * (self.task_start + self.task_steps)
        local = float(np.clip((global_step - self.task_start) / self.task_steps, 0.0, 1.0))
        decay = min(local / self.fraction, 1.0)
        return self.start + (self.end - self.start) * decay


@dataclass(frozen=True)
class AlgoSpec:
    """One learner: its ``--set`` section, construction and per-task hooks.

    :param name: ``--algo`` value, also the name of its config section (``ppo.n_steps``)
    :param config_cls: the section's frozen dataclass (a field of the same name on ``RunConfig``)
    :param build: constructs the learner with the method's policy
    :param start_task: learner-specific preparation at a task's first step
    :param check: range checks of the section (raises :class:`UsageError`)
    :param critic_moe: the critic carries the method's network unless ``net.critic_moe`` says otherwise
    :param critic_sees_action: the critic's input is (obs, action) (Q-function) rather than obs
    :param rollout: env steps trained in one piece: a task's budget rounds up to a multiple
    :param regularizer_defaults: regularizer kwargs beneath the suite's and the user's settings
    :param in_task_checkpoints: a run can resume inside a task (:mod:`rl_moe.continual.intask`);
        False where the learner's state is too large to save often (TD3's replay buffer)
    """

    name: str
    config_cls: type
    build: Builder
    start_task: TaskStart
    check: Callable[[Any], None]
    critic_moe: bool = False
    critic_sees_action: bool = False
    rollout: Callable[[Any], int] = lambda _section: 1
    regularizer_defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    in_task_checkpoints: bool = False

    def steps_per_task(self, section: Any, steps: int) -> int:
        """Env steps a task really runs: ``steps`` rounded up to whole rollouts."""
        piece = self.rollout(section)
        return -(-steps // piece) * piece

    def critic_input(self, obs_dim: int, act_dim: int) -> int:
        return obs_dim + act_dim if self.critic_sees_action else obs_dim


def _build_ppo(p: PPOConfig, env: Any, regs: list, common: dict) -> Any:
    return ALGOS["ppo"](
        MoEActorCriticPolicy, env, regularizers=regs,
        learning_rate=TaskLinearSchedule(p.lr_start, p.lr_end, p.lr_decay_fraction),
        n_steps=p.n_steps, batch_size=p.batch_size, n_epochs=p.n_epochs, gamma=p.gamma,
        gae_lambda=p.gae_lambda, clip_range=p.clip_range, max_grad_norm=p.max_grad_norm,
        ent_coef=p.ent_coef, vf_coef=p.vf_coef, fast_update=p.fast_update, grad_clip=p.grad_clip,
        kl_lr=None if p.target_kl is None else KLAdaptiveLR(p.target_kl), **common,
    )  # fmt: skip


def _start_ppo(model: Any, p: PPOConfig, global_step: int, steps_per_task: int) -> None:
    model.lr_schedule = TaskLinearSchedule(p.lr_start, p.lr_end, p.lr_decay_fraction, global_step, steps_per_task)
    if p.target_kl is not None:  # the adaptive rate starts each task where SBX starts it: lr_schedule(1)
        for group in model.policy.optimizer.param_groups:
            group["lr"] = p.lr_start


def _check_ppo(p: PPOConfig) -> None:
    check_positive("ppo", p, ("n_envs", "n_steps", "batch_size", "n_epochs", "lr_start", "lr_decay_fraction", "clip_range", "max_grad_norm"), ("lr_end", "ent_coef", "vf_coef"))
    check_within("ppo", p, ("gamma", "lr_decay_fraction"), 0.0, 1.0, True)
    if p.target_kl is not None and not p.target_kl > 0:
        raise UsageError(f"ppo.target_kl must be > 0 or none, got {p.target_kl}")
    check_within("ppo", p, ("gae_lambda",), 0.0, 1.0, False)
    check_choice(p.grad_clip, tuple(GRAD_CLIPS), "ppo.grad_clip")
    # SB3 normalises advantages per minibatch, which needs two samples (it asserts otherwise).
    if p.batch_size < 2:
        raise UsageError(f"ppo.batch_size must be >= 2 (advantages are normalised per minibatch), got {p.batch_size}")
    if p.n_envs * p.n_steps < 2:
        raise UsageError(f"ppo.n_envs * ppo.n_steps must be >= 2 (the rollout is split into minibatches), got {p.n_envs} * {p.n_steps}")


def _build_td3(t: TD3Config, env: Any, regs: list, common: dict) -> Any:
    act_dim = int(np.prod(env.action_space.shape))
    noise: Any = NormalActionNoise(np.zeros(act_dim), t.action_noise_std * np.ones(act_dim))
    if env.num_envs > 1:
        noise = VectorizedActionNoise(noise, env.num_envs)
    return ALGOS["td3"](
        MoETD3Policy, env, regularizers=regs, learning_rate=t.lr, buffer_size=t.buffer_size,
        learning_starts=t.learning_starts, batch_size=t.batch_size, tau=t.tau, gamma=t.gamma,
        train_freq=t.train_freq, gradient_steps=t.gradient_steps, policy_delay=t.policy_delay,
        action_noise=noise if t.action_noise_std > 0 else None, target_policy_noise=t.target_policy_noise,
        target_noise_clip=t.target_noise_clip, fast_update=t.fast_update, **common,
    )  # fmt: skip


def _start_td3(model: Any, t: TD3Config, global_step: int, steps_per_task: int) -> None:
    # Old-task transitions would train the critic on the wrong reward: empty the buffer and
    # restart the random-action warm-up.
    if model.replay_buffer is not None:  # None until SB3 sets the model up
        model.replay_buffer.reset()
    model.learning_starts = global_step + t.learning_starts


def _check_td3(t: TD3Config) -> None:
    check_positive("td3", t, ("n_envs", "buffer_size", "batch_size", "train_freq", "gradient_steps", "policy_delay", "lr"), ("learning_starts", "action_noise_std", "target_policy_noise", "target_noise_clip"))
    check_within("td3", t, ("gamma", "tau"), 0.0, 1.0, True)


#: ``--algo`` name -> learner spec. PPO's critic is dense by default (SPHERE Algorithm 1); TD3's
#: critics carry the MoE (SPHERE Table 22), so SPHERE regularizes them and the DSC losses cover
#: the critics' DSC layers as well as the actor's.
LEARNERS: dict[str, AlgoSpec] = {
    "ppo": AlgoSpec(
        name="ppo", config_cls=PPOConfig, build=_build_ppo, start_task=_start_ppo, check=_check_ppo,
        rollout=lambda p: p.n_envs * p.n_steps, in_task_checkpoints=True,
    ),
    "td3": AlgoSpec(
        name="td3", config_cls=TD3Config, build=_build_td3, start_task=_start_td3, check=_check_td3,
        critic_moe=True, critic_sees_action=True,
        regularizer_defaults={"sphere": {"placement": "critic"}, "dsc": {"target": "both"}},
    ),
}  # fmt: skip


def get_learner(name: str) -> AlgoSpec:
    """The spec of ``--algo name``; :class:`UsageError` names the valid choices."""
    return LEARNERS[check_choice(name, tuple(LEARNERS), "algo")]


def check_fast_update(spec: AlgoSpec, section: Any) -> None:
    """The learner-independent ``fast_update`` choice of a section."""

    check_choice(section.fast_update, FAST_MODES, f"{spec.name}.fast_update")

