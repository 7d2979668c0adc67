"""The continual scheduler's files: each finished task's checkpoint (weights, regularizer state,
observation statistics, generator states), the unfinished task's in-task checkpoint, and the
bookkeeping in ``results.json`` that says which of them a resume may trust (a mixin of
:class:`~rl_moe.continual.scheduler.ContinualScheduler`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from stable_baselines3.common.vec_env import VecNormalize

from rl_moe.algos.common import RegularizedMixin
from rl_moe.atomic import write_atomic
from rl_moe.continual import intask, rng
from rl_moe.continual.learners import get_learner
from rl_moe.continual.scheduler_state import SchedulerState
from rl_moe.continual.state_files import load_regularizer_state, save_regularizer_state
from rl_moe.rundir import RunDir


class RunFiles(SchedulerState):
    """Writes and reads the run folder's checkpoints and training progress."""

    def _record_in_task(self, task_start: int, step: int) -> None:
        """results.json says how far the unfinished task got (its last in-task checkpoint)."""
        self.results.in_task = {"task_start": task_start, "step": step}
        self.results.save(self.files.results)

    def _read_in_task(self) -> dict[str, Any] | None:
        """The unfinished task's in-task checkpoint, or None (with one line when one exists but
        cannot be used: the task then restarts from its start, and the file stays for inspection
        until the next in-task checkpoint replaces it)."""
        res, path = self.results, self.files.in_task
        i = res.finished_tasks
        if i >= len(self.tasks) or res.evaluated_tasks != res.finished_tasks or not get_learner(self.cfg.algo).in_task_checkpoints:
            return None
        try:
            state = intask.read(path)
        except ValueError as exc:
            print(f"note: the in-task checkpoint {path} is {exc}; task {i + 1} restarts from its start", file=sys.stderr)
            return None
        if state is None:
            return None
        if state["task"] < i:  # killed after its task's checkpoint, before removing it: superseded
            path.unlink(missing_ok=True)
            return None
        if state["task"] != i or state["task_start"] != res.global_step:
            print(f"note: the in-task checkpoint {path} belongs to task {state['task'] + 1}, not task {i + 1}; task {i + 1} restarts from its start", file=sys.stderr)
            return None
        return state

    def _store_trained(self, i: int, start: int, end: int, curve: dict[str, list]) -> None:
        """Mark task ``i`` finished (its checkpoint is durable) with its periodic-eval curve."""
        res = self.results
        merged = res.eval_curves.setdefault(self.tasks[i].name, {"steps": [], "success": [], "return": []})
        n = len(merged["steps"])
        for key, values in curve.items():  # a key new to a resumed run's curve is padded in front
            column = merged.setdefault(key, [])
            column.extend([None] * (n - len(column)) + list(values))
        res.task_segments = res.task_segments[:i] + [[start, end]]
        res.global_step = end
        res.finished_tasks = i + 1
        res.in_task = None
        res.evaluated_tasks = i
        res.save(self.files.results)

    def _save_checkpoint(self, i: int) -> None:
        assert self.model is not None
        path = self.view.checkpoint(i)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Every file lands atomically and on disk before results.json names the task finished;
        # the checkpoint .zip last, since resume checks it first. Replay buffers are not part
        # of SB3's .zip; nothing large is written.
        if isinstance(self.model, RegularizedMixin):
            save_regularizer_state(RunDir.regularizer_state(path), self.model.regularizer_state())
        if isinstance(self.env, VecNormalize):
            env = self.env
            write_atomic(RunDir.vecnormalize(path), lambda tmp: env.save(tmp))
        self._boundary_state = rng.capture(self.model)
        boundary = self._boundary_state
        write_atomic(RunDir.training_state(path), lambda tmp: torch.save(boundary, tmp))
        model = self.model

        def save_zip(tmp: str) -> None:
            with open(tmp, "wb") as fh:  # a handle: SB3 would append ".zip" to a path
                model.save(fh)

        write_atomic(path, save_zip)

    def _load_regularizers(self, checkpoint: Path) -> None:
        """Continue the regularizers where the finished task left them (CBP utilities and ages,
        the C-CHAIN snapshot, ReDo and SPHERE counters); runs without the file start them fresh."""
        state = load_regularizer_state(RunDir.regularizer_state(checkpoint))
        if state is None:
            print(f"note: no regularizer state beside {checkpoint.name}; regularizers restart fresh", file=sys.stderr)
        elif isinstance(self.model, RegularizedMixin):
            self.model.load_regularizer_state(state)

    def load_vecnormalize(self, i: int) -> VecNormalize | None:
        """The observation statistics saved with finished task ``i``'s checkpoint (None: none)."""
        return self.view.load_vecnormalize(i)
