"""One run folder's ``results.json`` (schema 1, documented in docs/continual.md), validated and
read into a :class:`Run`; runs are grouped by :class:`RunKey` (suite, algo, method, protocol), the
suite under its name today (``cw10-paper`` runs are ``cw10``, and ``cw10`` runs from before it
became the paper's protocol are ``cw10-cw``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_moe.envs.suite_spec import current_task_fields
from rl_moe.envs.suites import current_suite_name
from rl_moe.rundir import RunDir

SCHEMA_VERSION = 1
RESULTS_FILE = RunDir.RESULTS
PROTOCOLS = ("crl", "rl")
ALGOS = ("ppo", "td3")
REQUIRED_KEYS: dict[str, type | tuple[type, ...]] = {
    "schema": int,
    "suite": str,
    "algo": str,
    "method": str,
    "protocol": str,
    "seed": int,
    "tasks": list,
    "steps_per_task": int,
    "finished_tasks": int,
    "complete": bool,
    "success_matrix": list,
    "own_success": list,
    "final_success": list,
}


class ReportError(ValueError):
    """A user-facing problem with the run folders (reported as one line, exit code 2)."""


@dataclass(frozen=True)
class RunKey:
    """Identity of a group of seeds."""

    suite: str
    algo: str
    method: str
    protocol: str


@dataclass(frozen=True)
class Run:
    """One run folder's results.

    :param path: the run folder (parent of ``results.json``)
    :param key: suite/algo/method/protocol
    :param seed: the run's seed
    :param tasks: task names in training order
    :param steps_per_task: env steps per task segment
    :param complete: every task finished
    :param own: success on task i right after its own segment (NaN if not evaluated)
    :param final: success of the final checkpoint on every task (NaN if not evaluated)
    :param matrix: success matrix, rows = checkpoint after task i, cols = task j (NaN = missing)
    :param eval_curves: task -> (global steps, success) of the periodic evaluation
    :param stored_cl: the ``cl_metrics`` the run wrote itself
    :param segments: (first, last) global step of each task's segment; default ``i·steps_per_task``
    :param rules: the protocol the run recorded (episode length, shared task fields, clipping,
        eval positions); empty for runs written before ``results.json`` held it
    :param heldout: own-task success of each task's checkpoint on held-out positions
        (``positions-<N>.json`` of ``python -m rl_moe.positions``; NaN for a task it does not
        cover, empty when the run has no usable file)
    :param heldout_positions: N of that file; 0 when the run has none
    :param heldout_note: why that file is left out or partial (:func:`rl_moe.report.loading.with_heldout`); empty if neither
    """

    path: Path
    key: RunKey
    seed: int
    tasks: tuple[str, ...]
    steps_per_task: int
    complete: bool
    own: tuple[float, ...]
    final: tuple[float, ...]
    matrix: tuple[tuple[float, ...], ...]
    eval_curves: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = field(default_factory=dict)
    stored_cl: dict[str, Any] = field(default_factory=dict)
    segments: tuple[tuple[int, int], ...] = ()
    rules: dict[str, Any] = field(default_factory=dict)
    heldout: tuple[float, ...] = ()
    heldout_positions: int = 0
    heldout_note: str = ""
    network: str = ""
    arithmetic: str = ""

    def segment_start(self, i: int) -> int:
        """First global step of task ``i``'s training segment."""
        return self.segments[i][0] if i < len(self.segments) else i * self.steps_per_task

    def segment_length(self, i: int) -> int:
        """Env steps task ``i`` really trained (PPO rounds the budget up to whole rollouts)."""
        return self.segments[i][1] - self.segments[i][0] if i < len(self.segments) else self.steps_per_task


def num(x: Any) -> float:
    """A JSON number as a float, None (not evaluated) as NaN."""
    return float("nan") if x is None else float(x)


def padded(values: list[Any], n: int, where: str) -> tuple[float, ...]:
    """A per-task list of at most ``n`` numbers, padded with NaN to ``n`` (tasks not reached)."""
    if not isinstance(values, list) or len(values) > n:
        raise ReportError(f"{where}: expected a list of at most {n} numbers, got {values!r:.60}")
    return tuple(num(v) for v in values) + (float("nan"),) * (n - len(values))


def _type_name(kind: type | tuple[type, ...]) -> str:
    return kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)


def parse_results(data: Any, path: Path) -> Run:
    """Validate one ``results.json`` payload and turn it into a :class:`Run`.

    :param data: the decoded JSON
    :param path: the file it came from (for messages)
    """
    if not isinstance(data, dict):
        raise ReportError(f"{path}: expected a JSON object, got {type(data).__name__}")
    if data.get("schema") != SCHEMA_VERSION:
        raise ReportError(f"{path}: unsupported schema {data.get('schema')!r}; valid choices: {SCHEMA_VERSION}")
    for name, kind in REQUIRED_KEYS.items():
        if name not in data:
            raise ReportError(f"{path}: missing key {name!r} (schema {SCHEMA_VERSION} needs: {', '.join(REQUIRED_KEYS)})")
        if not isinstance(data[name], kind) or (kind is int and isinstance(data[name], bool)):
            raise ReportError(f"{path}: key {name!r} has type {type(data[name]).__name__}, expected {_type_name(kind)}")
    for name, valid in (("protocol", PROTOCOLS), ("algo", ALGOS)):
        if data[name] not in valid:
            raise ReportError(f"{path}: unknown {name} {data[name]!r}; valid choices: {', '.join(valid)}")
    tasks = tuple(str(t) for t in data["tasks"])
    rules = data.get("rules") or {}
    if not isinstance(rules, dict):
        raise ReportError(f"{path}: key 'rules' has type {type(rules).__name__}, expected dict")
    if isinstance(rules.get("task_fields"), dict):  # recorded before a field was renamed: today's names
        rules = {**rules, "task_fields": current_task_fields(rules["task_fields"])}
    n = len(tasks)
    if n == 0:
        raise ReportError(f"{path}: empty task list")
    rows = data["success_matrix"]
    if len(rows) > n:
        raise ReportError(f"{path}: success_matrix has {len(rows)} rows for {n} tasks")
    matrix = tuple(padded(r, n, f"{path}: success_matrix row {i}") for i, r in enumerate(rows))
    matrix += tuple((float("nan"),) * n for _ in range(n - len(rows)))
    curves = {}
    for task, curve in (data.get("eval_curves") or {}).items():
        steps, succ = curve.get("steps", []), curve.get("success", [])
        if len(steps) != len(succ):
            raise ReportError(f"{path}: eval_curves[{task!r}] has {len(steps)} steps but {len(succ)} values")
        curves[str(task)] = (tuple(float(s) for s in steps), tuple(num(v) for v in succ))
    return Run(
        path=path.parent,
        key=RunKey(current_suite_name(data["suite"], rules.get("episode_length")), data["algo"], data["method"], data["protocol"]),
        seed=data["seed"],
        tasks=tasks,
        steps_per_task=data["steps_per_task"],
        complete=data["complete"],
        own=padded(data["own_success"], n, f"{path}: own_success"),
        final=padded(data["final_success"], n, f"{path}: final_success"),
        matrix=matrix,
        eval_curves=curves,
        stored_cl=dict(data.get("cl_metrics") or {}),
        segments=tuple((int(a), int(b)) for a, b in data.get("task_segments") or ()),
        rules=rules,
    )
