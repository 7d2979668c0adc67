"""Where a task's episodes stop: the env's own stage terms at each episode's last step.

MetaWorld's ``info`` carries the terms its reward is built from (``near_object``,
``grasp_success``, ``in_place_reward``, ``obj_to_target``, ...). Their value at the end of the
episodes of a rollout says which stage a failing policy stops at (it reaches the object but never
grasps it, grasps it but never places it). Logged as ``rollout/final_<key>``, the mean over the
episodes that ended during the rollout; read at episode ends only, so it costs nothing per step.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback


class EpisodeStages(BaseCallback):
    """Log the mean of ``keys`` from the last ``info`` of every episode finished in a rollout.

    :param keys: numeric info keys (a family's :attr:`~rl_moe.envs.families.EnvFamily.stage_keys`)
    """

    def __init__(self, keys: tuple[str, ...]) -> None:
        super().__init__()
        self.keys = keys
        self._values: dict[str, list[float]] = defaultdict(list)

    def _on_step(self) -> bool:
        dones = self.locals["dones"]
        if dones.any():
            infos = self.locals["infos"]
            for i in np.flatnonzero(dones):
                for key in self.keys:
                    if key in infos[i]:
                        self._values[key].append(float(infos[i][key]))
        return True

    def _on_rollout_end(self) -> None:
        for key, values in self._values.items():
            if values:
                self.logger.record(f"rollout/final_{key}", float(np.mean(values)))
        self._values.clear()
