"""Building the learner of a run: network configs from the method, the learner from its spec."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.vec_env import VecEnv

from rl_moe.algos.common import RegularizedMixin
from rl_moe.algos.trac import OPTIMIZERS
from rl_moe.continual.config import RunConfig
from rl_moe.continual.learners import get_learner
from rl_moe.continual.methods import build_regularizers, get_method
from rl_moe.nn import NetConfig, width_multiplier_for_params


class NetPair(NamedTuple):
    """Actor and critic network configs of a run."""

    actor: NetConfig
    critic: NetConfig


def _side(cfg: RunConfig, role: str, is_method_net: bool, in_dim: int, out_dim: int) -> NetConfig:
    method = get_method(cfg.method)
    net = cfg.net
    width = net.width_multiplier if is_method_net else 1.0
    if is_method_net and method.param_ratio is not None:
        width = width_multiplier_for_params(in_dim, out_dim, net.hidden, method.param_ratio)
    return net.network(
        kind=method.kind if is_method_net else "mlp",
        layer_norm=is_method_net and (method.layer_norm or net.layer_norm),
        activation=method.activation if is_method_net and method.activation is not None else net.activation,
        width_multiplier=width,
        spectral_norm=net.spectral_norm or role in method.spectral_norm,
    )


def net_configs_for(cfg: RunConfig, obs_dim: int, act_dim: int) -> NetPair:
    """Actor/critic configs: the method's network on the MoE side(s), a dense MLP elsewhere.

    Which critic carries the MoE by default is the learner's (:data:`~rl_moe.continual.learners.LEARNERS`). Raises
    ValueError for invalid settings (e.g. K > E).
    """
    spec = get_learner(cfg.algo)
    critic_moe = cfg.net.critic_moe if cfg.net.critic_moe is not None else spec.critic_moe
    critic_in = spec.critic_input(obs_dim, act_dim)
    return NetPair(_side(cfg, "actor", cfg.net.actor_moe, obs_dim, act_dim), _side(cfg, "critic", critic_moe, critic_in, 1))


def build_model(cfg: RunConfig, env: VecEnv, device: str) -> BaseAlgorithm:
    """A fresh learner with the method's networks and regularizers (seeded by ``cfg.seed``)."""
    spec = get_learner(cfg.algo)
    obs_dim = int(np.prod(env.observation_space.shape))
    act_dim = int(np.prod(env.action_space.shape))
    nets = net_configs_for(cfg, obs_dim, act_dim)
    policy_kwargs: dict[str, Any] = {"actor_cfg": nets.actor, "critic_cfg": nets.critic}
    method = get_method(cfg.method)
    if method.bounded_mean:
        policy_kwargs["bounded_mean"] = True
    if method.optimizer is not None:
        policy_kwargs["optimizer_class"] = OPTIMIZERS[method.optimizer]
        # SB3 gives PPO's Adam eps 1e-5 only when optimizer_class is Adam itself: a wrapped Adam keeps it.
        policy_kwargs["optimizer_kwargs"] = {"eps": 1e-5} if cfg.algo == "ppo" else {}
    regs = build_regularizers(method.regularizers, cfg.regularizers)
    common: dict[str, Any] = {"seed": cfg.seed, "device": device, "verbose": 0, "policy_kwargs": policy_kwargs}
    return spec.build(cfg.learner_settings, env, regs, common)


def begin_task(model: BaseAlgorithm, cfg: RunConfig, task_index: int, global_step: int) -> None:
    """Prepare ``model`` for task ``task_index`` starting at ``global_step``.

    Runs the learner's task start (PPO: the task-local learning-rate schedule; TD3: an empty
    replay buffer and a fresh random-action warm-up), then the regularizers' ``on_task_start``
    through ``algo.start_task``.
    """
    model.num_timesteps = global_step
    spec = get_learner(cfg.algo)
    spec.start_task(model, cfg.learner_settings, global_step, cfg.steps_per_task)
    if isinstance(model, RegularizedMixin):  # every learner the scheduler builds
        model.start_task(task_index)
