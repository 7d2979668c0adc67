"""Finding, validating and grouping run folders: every ``results.json`` under the paths given
(:mod:`rl_moe.report.runs`), with what the folder's ``config.json``, ``positions-<N>.json`` and
``experts.json`` add, grouped by :class:`~rl_moe.report.runs.RunKey` into the seeds that tables
and bands aggregate over (:mod:`rl_moe.report.grouping` sets apart networks and protocols)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rl_moe.report.grouping import split_by_network, split_by_rules, with_config
from rl_moe.report.runs import RESULTS_FILE, ReportError, Run, RunKey, num, padded, parse_results
from rl_moe.rundir import RunDir


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
        heldout = [num(v) for v in data["own_success_heldout"]]
        train = [num(v) for v in data["own_success_train"]]
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
    return replace(run, heldout=padded(heldout, len(run.tasks), str(path)), heldout_positions=n, heldout_note=note)


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
