"""Thin PPO and TD3 subclasses whose ``train()`` adds named regularizer terms."""

from rl_moe.algos.ppo import MoEPPO
from rl_moe.algos.td3 import MoETD3

#: Learners by CLI name.
ALGOS = {"ppo": MoEPPO, "td3": MoETD3}

__all__ = ["ALGOS", "MoEPPO", "MoETD3"]
