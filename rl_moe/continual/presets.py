"""Per-suite PPO and TD3 hyperparameters (SPHERE paper, appendix A.4 Table 2).

Suites name their preset in ``presets`` (``{"ppo": "metaworld", "td3": "metaworld"}``); every
field can be changed from the CLI with ``--set ppo.n_steps=64`` and the like.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    :param fast_update: the learner's sync-free update (:mod:`rl_moe.algos.fast`): ``auto`` (on
        CUDA), ``on`` (also on a CPU) or ``off`` (SB3's loop everywhere); same maths either way
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


PPO_PRESETS: dict[str, PPOConfig] = {
    "metaworld": PPOConfig(),
    "humanoidbench": PPOConfig(n_envs=128, n_steps=16, batch_size=64, lr_decay_fraction=0.5, normalize_obs=True, normalize_reward=True),
    # Pendulum-sized: 4 x 256 steps per update so a 20k-step task sees ~20 updates.
    "smoke": PPOConfig(n_envs=4, n_steps=256, batch_size=64, n_epochs=10, gamma=0.98, lr_start=1e-3, lr_end=3e-4),
}

TD3_PRESETS: dict[str, TD3Config] = {
    "metaworld": TD3Config(),
    "humanoidbench": TD3Config(normalize_obs=True),
    "smoke": TD3Config(buffer_size=100_000, learning_starts=1_000, batch_size=128, gamma=0.98),
}
