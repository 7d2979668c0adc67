"""The continual scheduler's evaluation: the periodic and end-of-task scores of a task, the
success-matrix row, and what each task logs (a mixin of
:class:`~rl_moe.continual.scheduler.ContinualScheduler`)."""

from __future__ import annotations

import time
from typing import Any

import torch
from stable_baselines3.common.vec_env import VecNormalize

from rl_moe.continual.evaluation import EVAL_TAGS, EvalEnvs, EvalPoint, EvalResult, append_point, evaluate, release_memory
from rl_moe.continual.progress import draw_evaluation
from rl_moe.continual.scheduler_state import SchedulerState
from rl_moe.envs.factories import EnvFactory
from rl_moe.tblog import dump_keys

#: Own-task success logged with the task index as its x axis (docs/metrics.md), not the global step.
SUCCESS_AFTER_TASK = "cl/success_after_task"
#: Every tag logged against the task index.
TASK_INDEX_TAGS = (SUCCESS_AFTER_TASK,)


def in_first_tasks(tag: str, step: int, tasks: int, end_step: int, *, keep_end_step: bool) -> bool:
    """Whether a logged point belongs to a run's first ``tasks`` tasks, which ended at env step
    ``end_step``: a tag of :data:`TASK_INDEX_TAGS` by its index (below ``tasks``), the others by
    env step (below ``end_step``).

    At ``end_step`` itself a run that goes on starts its next task with an evaluation
    (:data:`~rl_moe.continual.evaluation.EVAL_TAGS`), and one that stops there logs its
    sequence-wide ``cl/*`` aggregates. ``keep_end_step`` keeps that step's points other than the
    evaluation (cutting a longer run down to its first tasks); without it every point there is
    left out (comparing a longer run with a shorter one)."""
    if tag in TASK_INDEX_TAGS:
        return step < tasks
    if step == end_step:
        return keep_end_step and not tag.startswith(EVAL_TAGS)
    return step < end_step


class TaskEvaluation(SchedulerState):
    """Scores tasks on their eval envs and stores and logs what a task's end yields."""

    def _label(self, i: int) -> str:
        return f"[task {i + 1}/{len(self.tasks)} {self.tasks[i].name}]"

    def eval_factories(self, j: int, heldout: bool | None = None, n_envs: int | None = None) -> list[EnvFactory]:
        """Fixed-seed eval envs of task ``j`` (:meth:`RunView.eval_factories`)."""
        return self.view.eval_factories(j, heldout, n_envs)

    def _eval_workers(self) -> int:
        """The pool's workers for evaluation: the training task's (the run's under ``envpool``;
        under ``auto`` one when it measured the official envs faster: the machine is busy)."""
        return max(1, self._backend.chosen.workers)

    def _obs_rms(self) -> Any:
        return self.env.obs_rms if isinstance(self.env, VecNormalize) else None

    def _evaluate(self, j: int, n_episodes: int, reuse: bool = True, beside: bool = True) -> EvalPoint:
        """Score task ``j`` under ``eval.positions`` (:class:`EvalPoint`).

        :param beside: also score the held-out positions under ``both`` (the matrix's other
            columns skip them: only the main view enters the success matrix)
        """
        main = self._evaluate_view(j, n_episodes, reuse, None)
        heldout = self._evaluate_view(j, n_episodes, reuse, True) if beside and self.cfg.eval.positions == "both" else None
        return EvalPoint(main, heldout)

    def _evaluate_view(self, j: int, n_episodes: int, reuse: bool, heldout: bool | None) -> EvalResult:
        """One view of task ``j``. The training task's eval envs are built once and reused (its
        periodic evaluations); other tasks' are built for one evaluation and closed: holding
        every task's envs would cost ~18 MB per MetaWorld env."""
        assert self.model is not None
        if not reuse:
            return evaluate(self.model, self.eval_factories(j, heldout), n_episodes, self._obs_rms(), self.cfg.vec_env)
        key = (j, heldout)
        for k in [k for k in self._eval_envs if k[0] != j]:
            self._eval_envs.pop(k).close()
        if key not in self._eval_envs:
            self._eval_envs[key] = EvalEnvs(self.eval_factories(j, heldout), self.cfg.vec_env, self._eval_workers())
        return evaluate(self.model, self._eval_envs[key], n_episodes, self._obs_rms())

    def _probe_input(self, states: torch.Tensor) -> torch.Tensor:
        rms = self._obs_rms()
        if rms is None:
            return states
        # The actor sees normalized observations under VecNormalize; probe it the same way.
        assert isinstance(self.env, VecNormalize)
        return torch.as_tensor(self.env.normalize_obs(states.numpy()), dtype=torch.float32)

    def _evaluate_and_store(self, i: int, train_seconds: float) -> None:
        res = self.results
        t1 = time.perf_counter()
        row = self._evaluate_row(i)
        eval_seconds = time.perf_counter() - t1
        own = row[i]
        assert own is not None
        end = res.global_step
        res.success_matrix[i] = [None if r is None else r.success for r in row]
        res.own_per_env[i] = own.main.per_env()
        append_point(res.eval_curves[self.tasks[i].name], end, own.curve_values())
        res.evaluated_tasks = i + 1
        res.save(self.files.results)
        self._log_task(i, end, own, row, train_seconds, eval_seconds)
        if self.cfg.eval.clip_steps:
            self._log_clip(i, end)

    def _log_clip(self, i: int, step: int) -> None:
        """``video/<task>``: a clip of task ``i``'s policy on its first eval position, at the task's
        end (``eval.clip_steps``; :mod:`rl_moe.recording`), after everything the run needs is saved."""
        from rl_moe.recording import VideoSettings, clip, log_clip  # lazy: MuJoCo rendering only when asked

        e = self.cfg.eval
        settings = VideoSettings(width=e.clip_size[0], height=e.clip_size[1], stride=e.clip_stride, steps=e.clip_steps)
        episode = clip(self.model, self.eval_factories(i)[0], settings, int(self.cfg.suite_data["episode_length"]), self._obs_rms())
        assert self.logger is not None
        log_clip(self.logger, f"video/{self.tasks[i].name}", episode.frames, step, settings.fps)

    def _evaluate_row(self, i: int) -> list[EvalPoint | None]:
        cols = self._matrix_columns(i)
        row: list[EvalPoint | None] = [None] * len(self.tasks)
        for k, j in enumerate(cols):
            if self.progress:
                draw_evaluation(self._label(i), k, len(cols))
            row[j] = self._evaluate(j, self.cfg.eval.matrix_episodes, reuse=j == i, beside=j == i)
        if self.progress:
            draw_evaluation(self._label(i), len(cols), len(cols))
        release_memory()
        return row

    def _matrix_columns(self, i: int) -> list[int]:
        """The tasks evaluated at the end of task ``i`` (the success matrix's row)."""
        last = i == len(self.tasks) - 1
        return list(range(len(self.tasks))) if (self.cfg.eval.full_matrix or last) else [i]

    def _log_task(self, i: int, end: int, own: EvalPoint, row: list[EvalPoint | None], train_s: float, eval_s: float) -> None:
        log = self.logger
        assert log is not None
        seen = [r.success for r in row[: i + 1] if r is not None]
        log.record("cl/own_success", own.success)
        log.record("cl/avg_success_seen", sum(seen) / len(seen))
        log.record("time/task_seconds", train_s)
        log.record("time/matrix_eval_seconds", eval_s)
        dump_keys(log, ("cl/own_success", "cl/avg_success_seen", "time/task_seconds", "time/matrix_eval_seconds"), end)
        log.record(SUCCESS_AFTER_TASK, own.success)
        dump_keys(log, TASK_INDEX_TAGS, i)

    def _finish(self) -> None:
        res, log = self.results, self.logger
        if not res.complete or log is None:
            return
        metrics = res.cl_metrics()
        keys = [f"cl/{key}" for key, value in metrics.items() if value is not None]
        for key in keys:
            log.record(key, metrics[key[3:]])
        dump_keys(log, keys, res.global_step)
        res.save(self.files.results)
