"""How much of a stochastic policy's action mean lies outside its action box.

MetaWorld clips actions to [-1, 1]. Where the Gaussian mean of PPO's actor sits outside that box,
the clipped action no longer moves with the mean, so the actor's updates stop changing what the
env sees there (docs/results.md, §5, "action-mean saturation"). Logged by the plasticity probe as
``policy/mean_outside_box`` on the held-out batch and, with ``probe.online``, on rollout states.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor


def mean_outside_box(policy: Any, obs: Tensor, action_space: spaces.Space) -> float | None:
    """Share of the entries of the action distribution's mode (the Gaussian mean; a squashed
    distribution's bounded mode) below ``action_space.low`` or above ``.high`` on ``obs``; None
    for a policy without an action distribution (TD3) or a non-Box action space."""
    if not isinstance(action_space, spaces.Box) or not hasattr(policy, "get_distribution"):
        return None
    with torch.no_grad():
        mode = policy.get_distribution(obs).mode()
    low = torch.as_tensor(np.asarray(action_space.low, dtype=np.float32), device=mode.device)
    high = torch.as_tensor(np.asarray(action_space.high, dtype=np.float32), device=mode.device)
    return float(((mode < low) | (mode > high)).float().mean())
