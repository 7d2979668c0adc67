"""A dependency-free progress line on stderr (SB3's ``progress_bar=True`` needs tqdm and rich)."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TextIO, runtime_checkable

from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm


@runtime_checkable
class EpochHooked(Protocol):
    """A learner that reports each epoch of its update (:class:`rl_moe.algos.MoEPPO`)."""

    on_epoch: Callable[[int, int], None] | None


@dataclass
class Phases:
    """Time a task has spent in each phase of training, the ETA's inputs.

    ``rollout`` runs from a rollout's start to its end (env steps, acting); ``between`` from a
    rollout's end to the next one's start: the update, and the periodic evaluation or checkpoint
    that falls there. Every second of training lies in one of the two, so the two rates add up to
    the time training takes even when a busy machine slows one phase and not the other.
    """

    rollout_seconds: float = 0.0
    rollout_steps: int = 0
    update_seconds: float = 0.0
    updates: int = 0
    rollout_size: int = 0  # steps one rollout collects (measured; 0 before one has ended)

    def seconds_per_step(self) -> float | None:
        return self.rollout_seconds / self.rollout_steps if self.rollout_steps > 0 else None

    def seconds_per_update(self) -> float | None:
        return self.update_seconds / self.updates if self.updates > 0 else None


@dataclass
class Pace:
    """What a run has measured, handed from one task's progress line to the next: the last task's
    phases and its end-of-task seconds (checkpoint and success matrix)."""

    phases: Phases | None = None
    tail_seconds: float = 0.0


class ProgressLine(BaseCallback):
    """Redraws ``[task i/N name] steps/total  steps/s  run ETA`` at most every ``interval`` seconds.

    The ETA adds the two phases of training, each at its own measured rate (:class:`Phases`):
    the steps left at the rollout rate, plus the updates left (rollouts to come, this task's and
    the later tasks') at the measured seconds per update, plus what is left of an update in
    progress, plus the end-of-task work (``pace.tail_seconds``) for this task and each later one.
    This task's measurements are used once it has them, the previous task's (``pace``) before.
    Until the first update has been timed the line says ``run ETA after the first update``: the
    updates are most of a task's time, and a bound without them read as a third of the truth.
    Within the first update the ETA is estimated from the epochs done; until a task's end (or its
    start evaluation) has been timed, it lacks that share and is shown as a lower bound
    (``>=0:04:10``). During a
    PPO update the line shows the epoch (``update 3/10``), drawn by the learner's ``on_epoch``
    hook, and the ETA moves with it.

    :param label: task label shown in front
    :param task_start: global step at which the task began
    :param task_steps: steps of the task
    :param stream: output stream (stderr by default)
    :param interval: minimum seconds between redraws
    :param later_steps: steps of the tasks still to come after this one
    :param later_tasks: tasks still to come after this one
    :param pace: the run's measurements so far (the previous task's phases and tail)
    :param tail_per_start_eval: the end-of-task evaluation's episodes per episode of the
        task-start evaluation (the scheduler's matrix cells x episodes / periodic episodes):
        until a task's end has been timed, its tail is guessed as this many times the task-start
        evaluation (the time from this line's creation to the training start, which that
        evaluation fills)
    :param clock: seconds, monotonic (a fake clock in tests)
    :param columns: the terminal's width, asked at every redraw (None: not a terminal, the line is
        drawn whole); by default the width of ``stream`` where it is a terminal. The line is fitted
        to it (:func:`fit_line`): a line that wraps scrolls instead of redrawing in place
    """

    def __init__(
        self,
        label: str,
        task_start: int,
        task_steps: int,
        stream: TextIO | None = None,
        interval: float = 1.0,
        later_steps: int = 0,
        later_tasks: int = 0,
        pace: Pace | None = None,
        tail_per_start_eval: float = 0.0,
        clock: Callable[[], float] = time.perf_counter,
        columns: Callable[[], int | None] | None = None,
    ) -> None:
        super().__init__()
        self.label, self.task_start, self.task_steps = label, task_start, task_steps
        self.stream = stream if stream is not None else sys.stderr
        self._columns = columns if columns is not None else (lambda: terminal_columns(self.stream))
        self._drawn = 0  # characters of the line drawn last
        self.interval, self.later_steps, self.later_tasks = interval, later_steps, later_tasks
        self.pace = pace if pace is not None else Pace()
        self.phases = Phases()  # this task's
        self._clock = clock
        self.tail_per_start_eval = tail_per_start_eval
        self._created = clock()
        self._start_eval_seconds = 0.0
        self._update: str = ""  # "update k/n" while an update runs
        self._epoch: tuple[int, int] | None = None  # (epochs begun - 1, epochs) of the update in progress
        self._last = 0.0
        self._rollout_start: tuple[float, int] | None = None  # (time, step) of the rollout in progress
        self._update_start: float | None = None  # time the rollout in progress ended

    # -- SB3 callback events -------------------------------------------------------------------
    def _on_training_start(self) -> None:
        self._last = self._clock()
        self._start_eval_seconds = self._last - self._created
        if isinstance(self.model, EpochHooked):
            self.model.on_epoch = self.on_epoch
        self._draw()

    def _on_rollout_start(self) -> None:
        now = self._clock()
        if self._update_start is not None:
            self.phases.update_seconds += now - self._update_start
            self.phases.updates += 1
            self._update_start = None
        self._update, self._epoch = "", None
        self._rollout_start = (now, self.num_timesteps)

    def _on_rollout_end(self) -> None:
        now = self._clock()
        if self._rollout_start is not None:
            began, step = self._rollout_start
            self.phases.rollout_seconds += now - began
            self.phases.rollout_steps += self.num_timesteps - step
            self.phases.rollout_size = self.num_timesteps - step
            self._rollout_start = None
        self._update_start = now
        self._draw()

    def on_epoch(self, epoch: int, n_epochs: int) -> None:
        """The learner begins epoch ``epoch`` (0-based) of ``n_epochs`` of an update."""
        self._update, self._epoch = f"update {epoch + 1}/{n_epochs}", (epoch, n_epochs)
        self._draw()

    def _on_step(self) -> bool:
        now = self._clock()
        if now - self._last >= self.interval:
            self._last = now
            self._draw()
        return True

    def _on_training_end(self) -> None:
        if isinstance(self.model, EpochHooked):
            self.model.on_epoch = None
        if self._update_start is not None:  # the task's last update
            self.phases.update_seconds += self._clock() - self._update_start
            self.phases.updates += 1
            self._update_start = None
        self._update, self._epoch = "", None
        self._draw()
        self.stream.write("\n")
        self.stream.flush()

    def stopped(self, saved_step: int) -> None:
        """Redraw the line for an interruption: the steps a resume keeps (``saved_step``, global:
        the last rollout boundary written), not the steps reached, which the next rollout would
        have counted. The caller ends the line with its own message."""
        done = min(max(saved_step - self.task_start, 0), self.task_steps)
        text = fit_line(self.label, done, self.task_steps, None, "stopped (saved at this step)", "", self._columns())
        self.stream.write(f"\r{text:<{self._drawn}}")
        self.stream.flush()
        self._drawn = len(text)

    # -- the estimate ---------------------------------------------------------------------------
    def _rates(self) -> tuple[float | None, float | None, int]:
        """Seconds per step, seconds per update and steps per rollout: this task's where measured
        (the rollout in progress included), else the previous task's."""
        now, ours, prior = self._clock(), self.phases, self.pace.phases or Phases()
        seconds, steps = ours.rollout_seconds, ours.rollout_steps
        if self._rollout_start is not None:
            seconds, steps = seconds + now - self._rollout_start[0], steps + self.num_timesteps - self._rollout_start[1]
        per_step = seconds / steps if steps > 0 else prior.seconds_per_step()
        per_update = ours.seconds_per_update() or prior.seconds_per_update()
        if per_update is None and self._epoch is not None and self._epoch[0] > 0 and self._update_start is not None:
            per_update = (now - self._update_start) / self._epoch[0] * self._epoch[1]  # the first update, from its epochs
        size = ours.rollout_size or prior.rollout_size or _rollout_size(self.model)
        return per_step, per_update, size

    def estimate(self) -> tuple[float, bool]:
        """Seconds left in the run, and whether that is the whole estimate (False: the updates or
        the task's end are not timed yet, and it is a lower bound). NaN before any step is timed."""
        done = min(self.num_timesteps - self.task_start, self.task_steps)
        per_step, per_update, size = self._rates()
        if per_step is None:
            return float("nan"), False
        left = self.task_steps - done
        tail = self.pace.tail_seconds or self._start_eval_seconds * self.tail_per_start_eval
        seconds = (left + self.later_steps) * per_step + tail * (1 + self.later_tasks)
        if per_update is None or size <= 0 or tail <= 0:
            return seconds, False
        updates = math.ceil(left / size) + self.later_tasks * math.ceil(self.task_steps / size)
        if self._update_start is not None:  # inside an update: what is left of it
            seconds += max(per_update - (self._clock() - self._update_start), 0.0)
        elif self._rollout_start is not None and left == 0:
            updates += 1  # the rollout that ends the task is still followed by its update
        return seconds + updates * per_update, True

    @property
    def steps_per_second(self) -> float | None:
        per_step, per_update, size = self._rates()
        if per_step is None:
            return None
        return size / (size * per_step + per_update) if per_update is not None and size > 0 else 1.0 / per_step

    def _draw(self) -> None:
        done = min(self.num_timesteps - self.task_start, self.task_steps)
        rate = self.steps_per_second
        eta, whole = self.estimate()
        per_step, per_update, _ = self._rates()
        if per_step is not None and per_update is None:
            shown = "after the first update"
        else:
            shown = ("" if whole or math.isnan(eta) else ">=") + hms(eta)
        text = fit_line(self.label, done, self.task_steps, rate, shown, self._update, self._columns())
        # Pad so a shorter line fully covers the previous one (carriage return, no clear).
        self.stream.write(f"\r{text:<{self._drawn}}")
        self.stream.flush()
        self._drawn = len(text)


def fit_line(label: str, done: int, total: int, rate: float | None, eta: str, phase: str, columns: int | None) -> str:
    """The progress line, as wide as ``columns`` allows (less one column: a line that fills the
    last one wraps in some terminals). The ETA is the last thing to go: first the bar narrows, then
    it goes, then the label loses its task name (``[task 2/10 push-wall-v3]`` -> ``[task 2/10]``)."""

    def bar(width: int) -> str:
        filled = int(width * done / total) if total > 0 else width
        return f" [{'#' * filled}{'-' * (width - filled)}]"

    rate_s = "?" if rate is None else f"{rate:.0f}"
    wide = f"{label}{bar(24)} {done:>9,}/{total:,}  {rate_s:>7} steps/s  run ETA {eta}" + (f"  {phase}" if phase else "")
    if columns is None:
        return wide
    short = label[: label.rfind(" ")] + "]" if label.startswith("[") and label.endswith("]") and " " in label else label
    count = f"{done:,}/{total:,}"
    lines = [wide]
    for head in (f"{label}{bar(12)}", label, short):
        lines += [f"{head} {count} {rate_s}/s ETA {eta} {phase}", f"{head} {count} {rate_s}/s ETA {eta}"]
    lines += [f"{short} {count} ETA {eta}", f"{short} ETA {eta}", f"ETA {eta}"]
    fits = next((line.rstrip() for line in lines if len(line.rstrip()) < columns), lines[-1])
    return fits[: max(columns - 1, 0)]


def terminal_columns(stream: TextIO) -> int | None:
    """The width of the terminal ``stream`` writes to, or None where it is not one (a log file)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns if stream.isatty() else None
    except (AttributeError, OSError, ValueError):  # no file descriptor (StringIO), or closed
        return None


def _rollout_size(model: object) -> int:
    """Steps per rollout an on-policy learner will collect (0 when unknown before one has ended)."""
    return int(model.n_steps * model.n_envs) if isinstance(model, OnPolicyAlgorithm) else 0


def draw_evaluation(label: str, done: int, total: int, stream: TextIO | None = None) -> None:
    """The end-of-task evaluation's progress (``[task 2/10 push-wall-v3] evaluating 3/10 tasks``),
    redrawn in place; the last call ends the line."""
    out = stream if stream is not None else sys.stderr
    out.write(f"\r{label} evaluating {done}/{total} task{'s' if total != 1 else ''}" + ("\n" if done == total else " " * 20))
    out.flush()


def hms(seconds: float) -> str:
    """``h:mm:ss`` (``?`` for NaN)."""
    if math.isnan(seconds):
        return "?"
    total = int(round(seconds))
    return f"{total // 3600}:{total % 3600 // 60:02d}:{total % 60:02d}"
