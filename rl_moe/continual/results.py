"""``results.json`` (schema 1, documented in docs/continual.md); written atomically (:mod:`rl_moe.atomic`).

Beyond the schema's fields, ``task_segments`` holds each task's ``[start, end]`` global steps
(needed to cut ``eval_curves`` when a suite repeats a task, as CW20 does) and ``global_step``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_moe.atomic import write_json_atomic
from rl_moe.continual.metrics import compute_cl_metrics, segment_aucs
from rl_moe.rundir import RunDir

SCHEMA = 1


@dataclass
class Results:
    """Mutable run results; :meth:`to_dict` gives the ``results.json`` object."""

    suite: str
    algo: str
    method: str
    protocol: str
    seed: int
    tasks: list[str]
    steps_per_task: int
    finished_tasks: int = 0
    evaluated_tasks: int | None = None
    success_matrix: list[list[float | None]] = field(default_factory=list)
    eval_curves: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    task_segments: list[list[int]] = field(default_factory=list)
    global_step: int = 0
    reference_aucs: list[float] | None = None
    rules: dict[str, Any] = field(default_factory=dict)
    in_task: dict[str, int] | None = None
    #: One entry per stretch of training (a task, or its rest after a resume): the task index and
    #: name, the global step it started from, the env backend it stepped on and the code's commit.
    provenance: list[dict[str, Any]] = field(default_factory=list)
    #: Task i's own-segment evaluation per eval env of the main view (``{"success": [...],
    #: "success_last": [...]}``, one number per env in the envs' order); None where not recorded
    #: (runs from before it was, and tasks not evaluated yet).
    own_per_env: list[dict[str, list[float]] | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.tasks)
        if not self.success_matrix:
            self.success_matrix = [[None] * n for _ in range(n)]
        self.own_per_env = list(self.own_per_env) + [None] * (n - len(self.own_per_env))
        if self.evaluated_tasks is None or self.evaluated_tasks > self.finished_tasks:
            # Files from before the field wrote a task's row together with the task.
            self.evaluated_tasks = self.finished_tasks
        _check_shape(self)

    def extend(self, tasks: list[str]) -> None:
        """Continue the run through ``tasks``, which must begin with its own: the success matrix
        grows with empty cells (the finished tasks' rows keep what they evaluated then)."""
        if tasks[: len(self.tasks)] != self.tasks:
            raise ValueError(f"tasks {tasks} do not continue the run's {self.tasks}")
        n = len(tasks)
        self.success_matrix = [row + [None] * (n - len(row)) for row in self.success_matrix]
        self.success_matrix += [[None] * n for _ in range(n - len(self.success_matrix))]
        self.own_per_env += [None] * (n - len(self.own_per_env))
        self.tasks = list(tasks)

    def head(self, n: int) -> Results:
        """The run as it stood once its first ``n`` tasks were trained and evaluated: what a run
        continued with a larger ``--tasks`` (:meth:`extend`) had written before it went on, so a
        slice run continued over CW10 still reports as a slice run.

        :raises ValueError: if fewer than ``n`` tasks are evaluated, ``n`` < 1, the run predates
            ``task_segments`` (nothing tells where task ``n`` ended), or row ``n - 1`` of the
            success matrix was not evaluated on every earlier task (``eval.full_matrix=false``)
        """
        if not 1 <= n <= (self.evaluated_tasks or 0):
            raise ValueError(f"head needs 1 <= n <= {self.evaluated_tasks} (the evaluated tasks), got {n}")
        if len(self.task_segments) < n:
            raise ValueError(f"the run records {len(self.task_segments)} task segments, so where task {n} ended is unknown")
        if any(v is None for v in self.success_matrix[n - 1][:n]):
            raise ValueError(f"row {n - 1} of the success matrix misses earlier tasks (eval.full_matrix=false)")
        segments = [list(seg) for seg in self.task_segments[:n]]

        def cut(task: str, curve: dict[str, list[float]]) -> dict[str, list[float]]:
            # A task's points lie in its own segments. One that comes back later (CW20) has its
            # next start evaluation at the step where the view ends: outside its kept segments.
            own = [seg for name, seg in zip(self.tasks, segments) if name == task]
            keep = [any(a <= step <= b for a, b in own) for step in curve["steps"]]
            return {k: [v for v, ok in zip(values, keep) if ok] for k, values in curve.items()}

        return Results(
            suite=self.suite, algo=self.algo, method=self.method, protocol=self.protocol, seed=self.seed,
            tasks=self.tasks[:n], steps_per_task=self.steps_per_task, finished_tasks=n, evaluated_tasks=n,
            success_matrix=[row[:n] for row in self.success_matrix[:n]],
            eval_curves={t: cut(t, c) for t, c in self.eval_curves.items() if t in self.tasks[:n]},
            task_segments=segments, global_step=segments[-1][1], reference_aucs=self.reference_aucs,
            rules=dict(self.rules), in_task=None, provenance=[p for p in self.provenance if p.get("task", 0) < n],
            own_per_env=self.own_per_env[:n],
        )  # fmt: skip

    @property
    def complete(self) -> bool:
        """Every task trained (checkpoint on disk) and its success-matrix row evaluated."""
        return self.finished_tasks == len(self.tasks) and self.evaluated_tasks == len(self.tasks)

    @property
    def own_success(self) -> list[float | None]:
        return [self.success_matrix[i][i] for i in range(len(self.tasks))]

    @property
    def final_success(self) -> list[float | None]:
        if not self.complete:
            return [None] * len(self.tasks)
        return list(self.success_matrix[-1])

    def cl_metrics(self) -> dict[str, float | None]:
        """Continual World metrics; all None until the run is complete."""
        if not self.complete:
            return {"average_performance": None, "forgetting": None, "forward_transfer": None}
        own = [float(v) for v in self.own_success]  # type: ignore[arg-type]
        final = [float(v) for v in self.final_success]  # type: ignore[arg-type]
        aucs = segment_aucs(self.tasks, self.task_segments, self.eval_curves)
        ref = self.reference_aucs
        if ref is not None:
            n = min(len(ref), len(aucs))
            aucs, ref = aucs[:n], ref[:n]
        return compute_cl_metrics(own, final, aucs if ref else None, ref or None).to_dict()

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "suite": self.suite,
            "algo": self.algo,
            "method": self.method,
            "protocol": self.protocol,
            "seed": self.seed,
            "tasks": list(self.tasks),
            "steps_per_task": self.steps_per_task,
            "finished_tasks": self.finished_tasks,
            "evaluated_tasks": self.evaluated_tasks,
            "complete": self.complete,
            "success_matrix": self.success_matrix,
            "own_success": self.own_success,
            "final_success": self.final_success,
            "eval_curves": self.eval_curves,
            "cl_metrics": self.cl_metrics(),
            "task_segments": self.task_segments,
            "global_step": self.global_step,
            "rules": self.rules,
            # How far the unfinished task got: its last in-task checkpoint (None between tasks).
            "in_task": self.in_task,
            "provenance": self.provenance,
            "own_per_env": self.own_per_env,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Results:
        return cls(
            suite=data["suite"], algo=data["algo"], method=data["method"], protocol=data["protocol"],
            seed=int(data["seed"]), tasks=list(data["tasks"]), steps_per_task=int(data["steps_per_task"]),
            finished_tasks=int(data["finished_tasks"]), success_matrix=data["success_matrix"],
            evaluated_tasks=None if data.get("evaluated_tasks") is None else int(data["evaluated_tasks"]),
            eval_curves=data.get("eval_curves", {}), task_segments=data.get("task_segments", []),
            global_step=int(data.get("global_step", 0)), rules=dict(data.get("rules") or {}),
            in_task=data.get("in_task"), provenance=list(data.get("provenance") or []),
            own_per_env=list(data.get("own_per_env") or []),
        )  # fmt: skip

    def save(self, path: str | Path) -> None:
        write_json_atomic(path, self.to_dict())


def _check_shape(res: Results) -> None:
    """:raises ValueError: if the counts or the success matrix do not fit the task list."""
    n = len(res.tasks)
    if not 0 <= res.finished_tasks <= n:
        raise ValueError(f"finished_tasks {res.finished_tasks} is not in 0..{n}")
    assert res.evaluated_tasks is not None
    if not max(0, res.finished_tasks - 1) <= res.evaluated_tasks <= res.finished_tasks:
        raise ValueError(f"evaluated_tasks {res.evaluated_tasks} does not fit finished_tasks {res.finished_tasks}")
    m = res.success_matrix
    if not isinstance(m, list) or len(m) != n or any(not isinstance(row, list) or len(row) != n for row in m):
        raise ValueError(f"success_matrix is not {n} x {n} (one row and column per task)")
    if any(v is not None and not isinstance(v, (int, float)) for row in m for v in row):
        raise ValueError("success_matrix holds a value that is neither a number nor null")
    segs = res.task_segments
    # Files from before task_segments existed hold none.
    if not isinstance(segs, list) or len(segs) not in (0, res.finished_tasks) or not all(
        isinstance(seg, list) and len(seg) == 2 and all(isinstance(v, int) for v in seg) and seg[0] <= seg[1] for seg in segs
    ):
        raise ValueError(f"task_segments is not a list of {res.finished_tasks} [start, end] step pairs")
    curves = res.eval_curves
    if not isinstance(curves, dict) or not set(curves) <= set(res.tasks):
        raise ValueError("eval_curves is not a mapping from the run's task names to curves")
    for task, curve in curves.items():
        # "return" is absent from files written before it was recorded.
        lists = [curve.get(k) for k in ("steps", "success", "return") if k != "return" or k in curve] if isinstance(curve, dict) else [None]
        if not all(isinstance(v, list) and len(v) == len(lists[0]) and all(isinstance(x, (int, float)) for x in v) for v in lists):
            raise ValueError(f"eval_curves[{task!r}] does not hold equal-length number lists steps, success (and return)")


def reference_aucs(run_dir: str | Path, tasks: list[str]) -> list[float] | None:
    """Per-task AUCs of an RL-protocol reference run (same task order), or None if unusable."""
    data = json.loads(RunDir(run_dir).results.read_text())
    ref = Results.from_dict(data)
    n = ref.finished_tasks
    if n == 0 or ref.tasks[:n] != tasks[:n]:
        return None
    return segment_aucs(ref.tasks[:n], ref.task_segments[:n], ref.eval_curves)
