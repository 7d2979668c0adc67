"""Finding and validating run folders (``results.json`` schema 1, documented in docs/continual.md).

A run folder holds ``results.json``, ``config.json`` and TensorBoard event files. Runs are grouped
by (suite, algo, method, protocol), the suite under its name today (``cw10-paper`` runs are ``cw10``,
and ``cw10`` runs from before it became the paper's protocol are ``cw10-cw``); seeds of a group are
what tables and bands aggregate over.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rl_moe.continual.config import RunConfig
from rl_moe.continual.networks import NETWORKS
from rl_moe.continual.resolve import moved_settings
from rl_moe.envs.suite_spec import current_task_fields
from rl_moe.envs.suites import current_suite_name
from rl_moe.errors import UsageError
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
    :param heldout_note: why that file is left out or partial (:func:`with_heldout`); empty if neither
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


def _num(x: Any) -> float:
    return float("nan") if x is None else float(x)


def _padded(values: list[Any], n: int, where: str) -> tuple[float, ...]:
    if not isinstance(values, list) or len(values) > n:
        raise ReportError(f"{where}: expected a list of at most {n} numbers, got {values!r:.60}")
    return tuple(_num(v) for v in values) + (float("nan"),) * (n - len(values))


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
    matrix = tuple(_padded(r, n, f"{path}: success_matrix row {i}") for i, r in enumerate(rows))
    matrix += tuple((float("nan"),) * n for _ in range(n - len(rows)))
    curves = {}
    for task, curve in (data.get("eval_curves") or {}).items():
        steps, succ = curve.get("steps", []), curve.get("success", [])
        if len(steps) != len(succ):
            raise ReportError(f"{path}: eval_curves[{task!r}] has {len(steps)} steps but {len(succ)} values")
        curves[str(task)] = (tuple(float(s) for s in steps), tuple(_num(v) for v in succ))
    return Run(
        path=path.parent,
        key=RunKey(current_suite_name(data["suite"], rules.get("episode_length")), data["algo"], data["method"], data["protocol"]),
        seed=data["seed"],
        tasks=tasks,
        steps_per_task=data["steps_per_task"],
        complete=data["complete"],
        own=_padded(data["own_success"], n, f"{path}: own_success"),
        final=_padded(data["final_success"], n, f"{path}: final_success"),
        matrix=matrix,
        eval_curves=curves,
        stored_cl=dict(data.get("cl_metrics") or {}),
        segments=tuple((int(a), int(b)) for a, b in data.get("task_segments") or ()),
        rules=rules,
    )


def with_config(run: Run) -> Run:
    """The run with what its ``config.json`` says: its method named with the regularizer settings
    it moved away from the method's own (``sphere [sphere.rho=0.001]``,
    :func:`rl_moe.continual.resolve.moved_settings`), so that a ``--set reg.*`` variant never
    shares a table row or a seed slot with the method itself; and the network and SPHERE lambda
    arithmetic it trained with (:meth:`~rl_moe.continual.config.RunConfig.labels`). Runs without a
    readable ``config.json`` keep their method's name and no labels."""
    try:
        cfg = RunConfig.from_dict(json.loads((run.path / "config.json").read_text()))
        moved, labels = moved_settings(cfg), cfg.labels()
    except (OSError, ValueError, KeyError, TypeError, UsageError):
        return run  # no config.json, or one this version cannot read
    run = replace(run, network=labels["network"], arithmetic=labels.get("lambda_arithmetic", ""))
    if not moved:
        return run
    label = ", ".join(f"{k}={v}" for k, v in sorted(moved.items()))
    return replace(run, key=replace(run.key, method=f"{run.key.method} [{label}]"))


def split_by_network(runs: list[Run]) -> list[Run]:
    """Runs of one suite and learner on different networks go into tables of their own, named by
    the network (``cw10 [sb3 network]``); runs of one method with different lambda arithmetics
    into rows of their own (``sphere [ours lambda]``). A study on one network keeps its names, and
    the report says the network above its tables."""
    networks: dict[tuple[str, str], set[str]] = {}
    arithmetics: dict[tuple[str, str, str], set[str]] = {}
    for r in runs:
        networks.setdefault((r.key.suite, r.key.algo), set()).add(r.network)
        arithmetics.setdefault((r.key.suite, r.key.algo, r.key.method), set()).add(r.arithmetic)
    out = []
    for r in runs:
        key = r.key
        if len(arithmetics[(key.suite, key.algo, key.method)]) > 1:
            key = replace(key, method=f"{key.method} [{r.arithmetic or 'unrecorded'} lambda]")
        if len(networks[(key.suite, key.algo)]) > 1:
            key = replace(key, suite=f"{key.suite} [{r.network or 'unrecorded'} network]")
        out.append(replace(r, key=key))
    return out


def describe_network(runs: Iterable[Run]) -> str:
    """One line naming the networks and SPHERE lambda arithmetics of ``runs``."""
    nets = sorted({r.network or "unrecorded (no config.json)" for r in runs})
    text = ", ".join(f"{n} ({NETWORKS[n].description})" if n in NETWORKS else n for n in nets)
    lam = sorted({r.arithmetic for r in runs if r.arithmetic})
    return text + (f"; SPHERE's lambda arithmetic: {', '.join(lam)}" if lam else "")


def read_experts(path: Path) -> dict[str, Any] | None:
    """A run folder's ``experts.json`` (:mod:`rl_moe.experts`), or None when it has none.

    :raises ReportError: a file that does not read as one
    """
    f = path / "experts.json"
    if not f.is_file():
        return None
    try:
        data = json.loads(f.read_text())
        shares, moved, n = data["shares"], data["movement"], int(data["n_experts"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ReportError(f"{f}: unreadable expert usage ({type(exc).__name__}: {exc})") from None
    if any(len(cell) != n for row in shares for cell in row) or len(moved) != len(shares):
        raise ReportError(f"{f}: shares and movement do not match its {n} experts and {len(shares)} checkpoints")
    return data


def with_heldout(run: Run) -> Run:
    """The run with its held-out scores from the folder's ``positions-<N>.json`` of largest N.

    The file also holds each checkpoint's success on the training positions; with fixed positions
    and the deterministic policy it equals results.json's own success. Where it does not, or its
    tasks are not the run's, the scores belong to another state of the run: they are left out.
    Either that, or a file that covers fewer tasks than the run finished (a run continued after
    it was scored), is said in ``heldout_note``, a line for the report's notes.
    """
    files = RunDir(run.path).positions_files()
    if not files:
        return run
    n, path = max(files.items())
    try:
        data = json.loads(path.read_text())
        tasks = tuple(str(t) for t in data["tasks"])
        heldout = [_num(v) for v in data["own_success_heldout"]]
        train = [_num(v) for v in data["own_success_train"]]
        stated = data["heldout_positions"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ReportError(f"{path}: unreadable held-out scores ({type(exc).__name__}: {exc})") from None
    if len(heldout) != len(tasks) or len(train) != len(tasks):
        raise ReportError(f"{path}: {len(tasks)} tasks but {len(heldout)} held-out and {len(train)} training scores")
    if stated != n:
        raise ReportError(f"{path}: holds heldout_positions {stated!r}, but its name says {n}")
    if tasks != run.tasks[: len(tasks)]:
        return replace(run, heldout_note=f"{path}: left out, its tasks {list(tasks)} are not the run's first {len(tasks)}")
    if any(not math.isclose(a, b, abs_tol=1e-9) for a, b in zip(train, run.own)):
        why = f"its training-position success {train} differs from results.json's {list(run.own[: len(tasks)])}"
        return replace(run, heldout_note=f"{path}: left out, {why} (rerun python -m rl_moe.positions)")
    finished = sum(math.isfinite(v) for v in run.own)
    note = ""
    if len(tasks) < finished:
        note = f"{path}: covers {len(tasks)} of the run's {finished} finished tasks (rerun python -m rl_moe.positions); the run counts only in their cells"
    return replace(run, heldout=_padded(heldout, len(run.tasks), str(path)), heldout_positions=n, heldout_note=note)


def _rule_parts(rules: dict[str, Any]) -> dict[str, str]:
    """Each recorded rule as the words the report prints for it."""
    parts = {"episode_length": f"{rules.get('episode_length')}-step episodes"}
    parts.update({f"task_fields.{k}": f"{k} {v}" for k, v in sorted((rules.get("task_fields") or {}).items())})
    if rules.get("grad_clip"):
        parts["grad_clip"] = f"{rules['grad_clip']} gradient clipping"
    parts["eval_positions"] = f"evaluated on {rules.get('eval_positions')} positions"
    return parts


def split_by_rules(runs: list[Run]) -> list[Run]:
    """One table per protocol: runs of a suite and learner that ran under different rules (a
    ``--set ppo.grad_clip=joint`` beside the suite's own, or runs from before a rule was recorded)
    go into groups of their own, each named by the suite and the rules that set it apart
    (``paper-hammer [joint gradient clipping]``), so no table ever mixes protocols."""
    sets: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        seen = sets.setdefault((r.key.suite, r.key.algo), [])
        if r.rules not in seen:
            seen.append(r.rules)
    out = []
    for r in runs:
        seen = sets[(r.key.suite, r.key.algo)]
        if len(seen) > 1:
            ours = _rule_parts(r.rules) if r.rules else {"rules": "rules not recorded"}
            others = [_rule_parts(o) for o in seen if o and o != r.rules]  # an unrecorded set stands apart anyway
            apart = [text for key, text in ours.items() if any(o.get(key) != text for o in others)]
            apart = apart or list(ours.values())  # the others only add a rule: name all of ours
            r = replace(r, key=replace(r.key, suite=f"{r.key.suite} [{', '.join(apart)}]"))
        out.append(r)
    return out


def describe_rules(rules: dict[str, Any]) -> str:
    """One line naming a run's protocol (``results.json``'s ``rules``)."""
    if not rules:
        return "rules not recorded (results.json written before it held them)"
    return ", ".join(_rule_parts(rules).values())


def find_results(paths: list[Path]) -> list[Path]:
    """Every ``results.json`` under ``paths`` (a path may also be a results file itself)."""
    found: list[Path] = []
    for p in paths:
        if not p.exists():
            raise ReportError(f"no such run folder: {p}")
        if p.is_file():
            if p.name != RESULTS_FILE:
                raise ReportError(f"{p}: not a run folder or {RESULTS_FILE}")
            found.append(p)
        else:
            found.extend(sorted(p.rglob(RESULTS_FILE)))
    # one entry per file, kept as the user first named it: a relative path stays relative in the
    # notes of a report that is committed beside the runs
    first: dict[Path, Path] = {}
    for f in found:
        first.setdefault(f.resolve(), f)
    unique = [first[key] for key in sorted(first)]
    if not unique:
        raise ReportError(f"no {RESULTS_FILE} found under: {', '.join(str(p) for p in paths)}")
    return unique


@dataclass(frozen=True)
class RunSet:
    """Runs grouped by key, plus what was set aside.

    :param groups: key -> runs sorted by seed
    :param dropped: (folder, reason) of runs left out (duplicated seeds)
    """

    groups: dict[RunKey, tuple[Run, ...]]
    dropped: tuple[tuple[Path, str], ...]

    @property
    def runs(self) -> list[Run]:
        return [r for runs in self.groups.values() for r in runs]

    @property
    def heldout_notes(self) -> list[str]:
        """The kept runs' held-out score files that are left out or partial, and why."""
        return [r.heldout_note for r in self.runs if r.heldout_note]


def _preference(run: Run) -> tuple[bool, int, str]:
    finished = sum(not math.isnan(v) for v in run.own)
    return (run.complete, finished, run.path.name)


def load_runs(paths: list[Path]) -> RunSet:
    """Load, validate and group every run under ``paths``.

    Runs of one suite must share the task list and the steps per task. When a seed appears twice
    in a group (a re-run in a new timestamped folder), the most complete and then newest is kept.

    :param paths: run folders, parent folders, or ``results.json`` files
    """
    runs = []
    for f in find_results(paths):
        try:
            data = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ReportError(f"{f}: unreadable results ({exc})") from None
        runs.append(with_heldout(with_config(parse_results(data, f))))
    by_suite: dict[str, Run] = {}
    for r in runs:
        ref = by_suite.setdefault(r.key.suite, r)
        if r.tasks != ref.tasks:
            raise ReportError(
                f"incompatible runs in suite {r.key.suite!r}: {r.path} has tasks {list(r.tasks)} but {ref.path} has {list(ref.tasks)}"
            )
        if r.steps_per_task != ref.steps_per_task:
            raise ReportError(
                f"incompatible runs in suite {r.key.suite!r}: {r.path} has steps_per_task {r.steps_per_task} but {ref.path} has {ref.steps_per_task}"
            )
    runs = split_by_network(split_by_rules(runs))
    chosen: dict[tuple[RunKey, int], Run] = {}
    dropped = []
    for r in sorted(runs, key=_preference, reverse=True):
        slot = (r.key, r.seed)
        if slot in chosen:
            dropped.append((r.path, f"seed {r.seed} duplicated by {chosen[slot].path}"))
        else:
            chosen[slot] = r
    groups: dict[RunKey, list[Run]] = {}
    for (key, _), r in chosen.items():
        groups.setdefault(key, []).append(r)
    ordered = {
        k: tuple(sorted(v, key=lambda r: r.seed))
        for k, v in sorted(groups.items(), key=lambda kv: (kv[0].suite, kv[0].algo, kv[0].protocol, kv[0].method))
    }
    return RunSet(groups=ordered, dropped=tuple(sorted(dropped)))
