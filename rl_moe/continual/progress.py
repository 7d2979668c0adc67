"""A dependency-free progress line on stderr (SB3's ``progress_bar=True`` needs tqdm and rich)."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Protocol, TextIO, runtime_checkable

from stable_baselines3.common.callbacks import BaseCallback


@runtime_checkable
class EpochHooked(Protocol):
    """A learner that reports each epoch of its update (:class:`rl_moe.algos.MoEPPO`)."""

    on_epoch: Callable[[int, int], None] | None


class ProgressLine(BaseCallback):
    """Redraws ``[task i/N name] steps/total  steps/s  ETA`` at most every ``interval`` seconds.

    The rate is measured over whole rollout-plus-update cycles (a rollout alone runs 4-6x faster
    than the cycle, so a rollout-only rate gives an ETA that much too short). Until this task's
    first cycle has finished the previous task's cycle rate (``prior_rate``) stands in, and without
    one no ETA is shown. The ETA covers the rest of the run, this task's remaining steps plus
    ``later_steps``, as h:mm:ss, plus ``tail_seconds`` (the end-of-task evaluation and checkpoint
    of the previous task) for this task and each later one. During a PPO update the line shows
    the update's epoch (``update 3/10``), drawn by the learner's ``on_epoch`` hook.

    :param label: task label shown in front
    :param task_start: global step at which the task began
    :param task_steps: steps of the task
    :param stream: output stream (stderr by default)
    :param interval: minimum seconds between redraws
    :param later_steps: steps of the tasks still to come after this one
    :param prior_rate: steps/s over the cycles of the previous task, if any
    :param tail_seconds: seconds a task spends after its last step (success matrix, checkpoint),
        as measured on the previous task; 0 before one has finished
    :param later_tasks: tasks still to come after this one
    :param counted_from: the global step this process starts from (a resume inside the task);
        the rate counts only the steps trained here
    """

    def __init__(
        self,
        label: str,
        task_start: int,
        task_steps: int,
        stream: TextIO | None = None,
        interval: float = 1.0,
        later_steps: int = 0,
        prior_rate: float | None = None,
        tail_seconds: float = 0.0,
        later_tasks: int = 0,
        counted_from: int | None = None,
    ) -> None:
        super().__init__()
        self.label, self.task_start, self.task_steps = label, task_start, task_steps
        self.stream = stream if stream is not None else sys.stderr
        self.interval, self.later_steps = interval, later_steps
        self.tail_seconds, self.later_tasks = tail_seconds, later_tasks
        self.counted_from = task_start if counted_from is None else counted_from
        self._update: str = ""  # "update k/n" while an update runs
        self._t0 = self._last = 0.0
        self._prior_rate = prior_rate
        self._cycle_rate: float | None = None  # steps/s over this task's finished rollout + update cycles

    def _on_training_start(self) -> None:
        self._t0 = self._last = time.perf_counter()
        if isinstance(self.model, EpochHooked):
            self.model.on_epoch = self.on_epoch
        self._draw()

    def on_epoch(self, epoch: int, n_epochs: int) -> None:
        """The learner begins epoch ``epoch`` (0-based) of ``n_epochs`` of an update."""
        self._update = f"update {epoch + 1}/{n_epochs}"
        self._draw()

    def _on_rollout_start(self) -> None:
        self._update = ""
        done = self.model.num_timesteps - self.counted_from
        if done > 0:  # an update has just finished: the whole cycle is in the elapsed time
            self._cycle_rate = done / max(time.perf_counter() - self._t0, 1e-9)

    def _on_step(self) -> bool:
        now = time.perf_counter()
        if now - self._last >= self.interval:
            self._last = now
            self._draw()
        return True

    def _on_training_end(self) -> None:
        if isinstance(self.model, EpochHooked):
            self.model.on_epoch = None
        self._update = ""
        self._draw()
        self.stream.write("\n")
        self.stream.flush()

    @property
    def cycle_rate(self) -> float | None:
        """Steps/s over whole cycles: this task's once one has finished, else the prior rate."""
        return self._cycle_rate if self._cycle_rate is not None else self._prior_rate

    def eta_seconds(self) -> float:
        """Seconds left in the run at the cycle rate (NaN while no cycle has been timed)."""
        done = min(self.num_timesteps - self.task_start, self.task_steps)
        rate = self.cycle_rate
        left = self.task_steps - done + self.later_steps
        tails = self.tail_seconds * (1 + self.later_tasks)
        return left / rate + tails if rate is not None and rate > 0 else float("nan")

    def _draw(self) -> None:
        done = min(self.num_timesteps - self.task_start, self.task_steps)
        rate = self.cycle_rate
        eta = self.eta_seconds()
        width = 24
        filled = int(width * done / self.task_steps)
        bar = "#" * filled + "-" * (width - filled)
        rate_s = "      ?" if rate is None else f"{rate:7.0f}"
        phase = f"  {self._update}" if self._update else ""
        # Pad so a shorter line fully covers the previous one (carriage return, no clear).
        self.stream.write(f"\r{self.label} [{bar}] {done:>9,}/{self.task_steps:,}  {rate_s} steps/s  run ETA {hms(eta)}{phase:<14}")
        self.stream.flush()


def hms(seconds: float) -> str:
    """``h:mm:ss`` (``?`` for NaN)."""
    if math.isnan(seconds):
        return "?"
    total = int(round(seconds))
    return f"{total // 3600}:{total % 3600 // 60:02d}:{total % 60:02d}"
