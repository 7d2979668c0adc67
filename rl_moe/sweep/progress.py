"""A sweep's progress line: trials done, running and queued, aggregate env steps/s, and an ETA.

Read from the trials' folders, so it works with every backend: a trial runs while its folder's
lock is held (:mod:`rl_moe.runlock`), its steps so far are the last step in its TensorBoard
events, and its budget is in its ``config.json``.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import NamedTuple, TextIO

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rl_moe.continual.config import RunConfig
from rl_moe.continual.progress import hms
from rl_moe.rundir import RunDir
from rl_moe.runlock import lock_holder
from rl_moe.sweep.trials import Outcome, Trial, TrialRunner, trained_steps
from rl_moe.tblog import quiet_tensorboard


def live_steps(run_dir: Path) -> int:
    """Env steps the run has trained so far: the last step of its TensorBoard scalars (SB3 logs
    every rollout), at least its finished tasks' steps."""
    steps = trained_steps(run_dir)
    tb = RunDir(run_dir).tb
    if any(tb.glob("events.*")):
        acc = EventAccumulator(str(tb), size_guidance={"scalars": 1})  # keeps each tag's last point
        with quiet_tensorboard():
            acc.Reload()
        steps = max([steps, *(acc.Scalars(tag)[-1].step for tag in acc.Tags()["scalars"] if tag.startswith(("time/", "rollout/")))])
    return steps


def budget(run_dir: Path) -> int | None:
    """Env steps the whole run trains (tasks x whole-rollout steps per task), once config.json exists."""

    try:
        cfg = RunConfig.from_dict(json.loads(RunDir(run_dir).config.read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return len(cfg.tasks) * cfg.effective_steps_per_task


class Snapshot(NamedTuple):
    """Where a sweep stands."""

    done: int
    running: int
    queued: int
    steps: int  # env steps trained in this sweep so far
    left: int | None  # env steps still to train (None until a trial's budget is known)


class TrialStates:
    """The trials this process has launched and seen return, updated by the thread that runs
    each one (:meth:`wrap`), so the progress line counts a trial as running from its launch (its
    run folder's lock comes only after the CLI has imported everything) and as done the moment
    it returns."""

    def __init__(self) -> None:
        self.started: set[Path] = set()
        self.finished: set[Path] = set()
        self._lock = threading.Lock()

    def wrap(self, runner: TrialRunner) -> TrialRunner:
        """``runner`` that records its trial's launch and return (in-process backends only: a Ray
        worker's records stay in the worker)."""

        def run(trial: Trial, command: list[str], env: dict[str, str]) -> Outcome:
            with self._lock:
                self.started.add(trial.run_dir)
            try:
                return runner(trial, command, env)
            finally:
                with self._lock:
                    self.finished.add(trial.run_dir)

        return run

    def mark_finished(self, run_dir: Path) -> None:
        with self._lock:
            self.finished.add(run_dir)

    def copy(self) -> tuple[set[Path], set[Path]]:
        """(started, finished), read together."""
        with self._lock:
            return set(self.started), set(self.finished)


def snapshot(trials: Sequence[Trial], finished: Collection[Path], before: dict[Path, int], started: Collection[Path] = ()) -> Snapshot:
    """Count the trials of this sweep and their steps: ``finished`` and ``started`` are the
    folders of trials that returned and that were launched; a trial is also running while a
    process holds its folder's lock (a Ray worker's). A trial not started yet is assumed to have
    the mean budget of those that did."""
    running = queued = steps = 0
    open_trials: list[tuple[int, int | None]] = []  # (steps so far, budget) of unfinished trials
    for t in trials:
        now = live_steps(t.run_dir)
        steps += max(0, now - before.get(t.run_dir, 0))
        if t.run_dir in finished:
            continue
        if t.run_dir in started or lock_holder(t.run_dir) is not None:
            running += 1
        else:
            queued += 1
        open_trials.append((now, budget(t.run_dir)))
    known = [b for _, b in open_trials if b is not None]
    left: int | None = 0 if not open_trials else None
    if known:
        mean = round(sum(known) / len(known))
        left = sum(max(0, (mean if b is None else b) - now) for now, b in open_trials)
    return Snapshot(len(finished), running, queued, steps, left)


def line(s: Snapshot, seconds: float) -> str:
    rate = s.steps / seconds if seconds > 0 else 0.0
    eta = hms(s.left / rate) if s.left is not None and rate > 0 else "?"
    return f"sweep: {s.done} done, {s.running} running, {s.queued} queued; {s.steps:,} env steps in {hms(seconds)}, {rate:.0f} env steps/s; ETA {eta}"


class Heartbeat:
    """Prints :func:`line` every ``every`` seconds from a daemon thread until :meth:`stop`."""

    def __init__(self, trials: Sequence[Trial], states: TrialStates, every: float, stream: TextIO | None = None) -> None:
        self.trials, self.states, self.every = list(trials), states, every
        self.before: dict[Path, int] = {}
        self.stream = stream if stream is not None else sys.stdout
        self.start = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Heartbeat:
        if self.every > 0:  # no progress lines: no event files read
            # A resumed trial restarts its unfinished task from the task's start, so this sweep's
            # steps count from its finished tasks, not from an interrupted attempt's last logged step.
            self.before = {t.run_dir: trained_steps(t.run_dir) for t in self.trials}
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            started, finished = self.states.copy()
            text = line(snapshot(self.trials, finished, self.before, started), time.monotonic() - self.start)
            print(text, file=self.stream, flush=True)
