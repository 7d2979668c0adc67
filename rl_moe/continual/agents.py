"""Building the learner of a run: network configs from the method, PPO/TD3 from the presets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.noise import NormalActionNoise, VectorizedActionNoise
from stable_baselines3.common.vec_env import VecEnv

from rl_moe.continual.config import RunConfig
from rl_moe.continual.methods import build_regularizers, get_method
from rl_moe.nn import NetConfig, width_multiplier_for_params


class NetPair(NamedTuple):
    """Actor and critic network configs of a run."""

    actor: NetConfig
    critic: NetConfig


def _side(cfg: RunConfig, is_method_net: bool, in_dim: int, out_dim: int) -> NetConfig:
    method = get_method(cfg.method)
    net = cfg.net
    kind = method.kind if is_method_net else "mlp"
    width = 1.0
    if is_method_net and method.param_ratio is not None:
        width = width_multiplier_for_params(in_dim, out_dim, net.hidden, method.param_ratio)
    return NetConfig(
        kind=kind,
        n_experts=net.n_experts,
        top_k=net.top_k,
        hidden=net.hidden,
        activation=net.activation,
        layer_norm=method.layer_norm and is_method_net,
        temperature=net.temperature,
        gate_hidden=net.gate_hidden,
        width_multiplier=width,
        sd_rank_fraction=net.sd_rank_fraction,
        dsc_atoms=net.dsc_atoms,
        dsc_top_k=net.dsc_top_k,
        ssmoe_alpha=net.ssmoe_alpha,
        ssmoe_top_c=net.ssmoe_top_c,
    )


def net_configs_for(cfg: RunConfig, obs_dim: int, act_dim: int) -> NetPair:
    """Actor/critic configs: the method's network on the MoE side(s), a dense MLP elsewhere.

    PPO's critic is dense by default (SPHERE Algorithm 1); TD3's critics carry the MoE by default
    (SPHERE Table 22). Raises ValueError for invalid settings (e.g. K > E).
    """
    critic_moe = cfg.net.critic_moe if cfg.net.critic_moe is not None else cfg.algo == "td3"
    critic_in = obs_dim + act_dim if cfg.algo == "td3" else obs_dim
    return NetPair(_side(cfg, cfg.net.actor_moe, obs_dim, act_dim), _side(cfg, critic_moe, critic_in, 1))


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


def build_model(cfg: RunConfig, env: VecEnv, device: str, tensorboard: bool = False) -> BaseAlgorithm:
    """A fresh learner with the method's networks and regularizers (seeded by ``cfg.seed``)."""
    from rl_moe.algos import ALGOS

    obs_dim = int(np.prod(env.observation_space.shape))
    act_dim = int(np.prod(env.action_space.shape))
    nets = net_configs_for(cfg, obs_dim, act_dim)
    policy_kwargs: dict[str, Any] = {"actor_cfg": nets.actor, "critic_cfg": nets.critic}
    method = get_method(cfg.method)
    regs = build_regularizers(method.regularizers, cfg.regularizers)
    common: dict[str, Any] = {"seed": cfg.seed, "device": device, "verbose": 0, "policy_kwargs": policy_kwargs}
    if cfg.algo == "ppo":
        from rl_moe.policies import MoEActorCriticPolicy

        p = cfg.ppo
        return ALGOS["ppo"](
            MoEActorCriticPolicy, env, regularizers=regs,
            learning_rate=TaskLinearSchedule(p.lr_start, p.lr_end, p.lr_decay_fraction),
            n_steps=p.n_steps, batch_size=p.batch_size, n_epochs=p.n_epochs, gamma=p.gamma,
            gae_lambda=p.gae_lambda, clip_range=p.clip_range, max_grad_norm=p.max_grad_norm,
            ent_coef=p.ent_coef, vf_coef=p.vf_coef, fast_update=p.fast_update, **common,
        )  # fmt: skip
    from rl_moe.policies import MoETD3Policy

    t = cfg.td3
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


def begin_task(model: BaseAlgorithm, cfg: RunConfig, task_index: int, global_step: int) -> None:
    """Prepare ``model`` for task ``task_index`` starting at ``global_step``.

    Sets the task-local learning-rate schedule (PPO) and, for TD3, empties the replay buffer and
    restarts the random-action warm-up (old-task transitions would train the critic on the wrong
    reward). Then calls the regularizers' ``on_task_start`` through ``algo.start_task``.
    """
    model.num_timesteps = global_step
    if cfg.algo == "ppo":
        p = cfg.ppo
        model.lr_schedule = TaskLinearSchedule(p.lr_start, p.lr_end, p.lr_decay_fraction, global_step, cfg.steps_per_task)
    else:
        buffer = getattr(model, "replay_buffer", None)
        if buffer is not None:
            buffer.reset()
        model.learning_starts = global_step + cfg.td3.learning_starts  # type: ignore[attr-defined]
    start_task = getattr(model, "start_task", None)
    if callable(start_task):
        start_task(task_index)
