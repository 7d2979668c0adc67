"""The learners' settings per env family, by preset name (suites name them in ``"presets"``).

PPO follows SPHERE appendix A.4, Table 2 (MetaWorld and HumanoidBench); TD3 follows SB3 and
Fujimoto et al. (2018). Every field can be changed with ``--set ppo.n_steps=64`` and the like.
"""

from __future__ import annotations

from typing import Any

from rl_moe.continual.learners import PPOConfig, TD3Config

#: learner -> preset name -> its config section.
PRESETS: dict[str, dict[str, Any]] = {
    "ppo": {
        "metaworld": PPOConfig(),
        # The SPHERE authors' code: actor and critic gradients clipped apart (rl_moe.algos.clipping).
        "metaworld-paper": PPOConfig(grad_clip="separate"),
        "humanoidbench": PPOConfig(n_envs=128, n_steps=16, batch_size=64, lr_decay_fraction=0.5, normalize_obs=True, normalize_reward=True),
        # Pendulum-sized: 4 x 256 steps per update so a 20k-step task sees ~20 updates.
        "smoke": PPOConfig(n_envs=4, n_steps=256, batch_size=64, n_epochs=10, gamma=0.98, lr_start=1e-3, lr_end=3e-4),
    },
    "td3": {
        "metaworld": TD3Config(),
        "humanoidbench": TD3Config(normalize_obs=True),
        # 4 envs: one gradient step per 4 env steps, a quarter of the cost; Pendulum is still solved
        # in a 20k-step task (own success 0.8, Top-K seed 0), while 8 envs (1 per 8) is not.
        "smoke": TD3Config(n_envs=4, buffer_size=100_000, learning_starts=1_000, batch_size=128, gamma=0.98),
    },
}  # fmt: skip


def learner_presets(algo: str) -> dict[str, Any]:
    """Preset name -> settings of learner ``algo``."""
    return PRESETS.get(algo, {})
