"""A dependency-free progress line on stderr (SB3's ``progress_bar=True`` needs tqdm and rich)."""

from __future__ import annotations

import math
import sys
import time
from typing import TextIO

from stable_baselines3.common.callbacks import BaseCallback


class ProgressLine(BaseCallback):
    """Redraws ``[task i/N name] steps/total  steps/s  ETA`` at most every ``interval`` seconds.

    :param label: task label shown in front
    :param task_start: global step at which the task began
    :param task_steps: steps of the task
    :param stream: output stream (stderr by default)
    :param interval: minimum seconds between redraws
    """

    def __init__(self, label: str, task_start: int, task_steps: int, stream: TextIO | None = None, interval: float = 1.0) -> None:
        super().__init__()
        self.label, self.task_start, self.task_steps = label, task_start, task_steps
        self.stream = stream if stream is not None else sys.stderr
        self.interval = interval
        self._t0 = self._last = 0.0

    def _on_training_start(self) -> None:
        self._t0 = self._last = time.perf_counter()
        self._draw()

    def _on_step(self) -> bool:
        now = time.perf_counter()
        if now - self._last >= self.interval:
            self._last = now
            self._draw()
        return True

    def _on_training_end(self) -> None:
        self._draw()
        self.stream.write("\n")
        self.stream.flush()

    def _draw(self) -> None:
        done = min(self.num_timesteps - self.task_start, self.task_steps)
        elapsed = max(time.perf_counter() - self._t0, 1e-9)
        rate = done / elapsed
        eta = (self.task_steps - done) / rate if rate > 0 else float("nan")
        width = 24
        filled = int(width * done / self.task_steps)
        bar = "#" * filled + "-" * (width - filled)
        eta_s = "     ?" if math.isnan(eta) else f"{eta:6.0f}s"
        self.stream.write(f"\r{self.label} [{bar}] {done:>9,}/{self.task_steps:,}  {rate:7.0f} steps/s  ETA {eta_s}")
        self.stream.flush()
