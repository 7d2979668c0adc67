"""A benchmark's worker process on one checkout: the same script in ``--worker`` mode, importing
that checkout's ``rl_moe`` first, answering one JSON line per request; and the pair of them a
comparison against a baseline checkout starts (``task_speed.py``, ``acting_forward.py``,
``eval_speed.py``)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TypeVar

HERE = Path(__file__).resolve().parent
#: This checkout: the tree the benchmarks belong to.
ROOT = HERE.parent
#: Set in a worker's environment: the checkout whose package it imports.
TREE_VAR = "RL_MOE_BENCH_TREE"
#: What one turn of a worker returns (:func:`alternated`).
T = TypeVar("T")


class _TreeEnvs(importlib.abc.MetaPathFinder):
    """Finds ``rl_moe.envs`` in the worker's checkout. It lives in the top-level ``envs/`` and
    installs as ``rl_moe.envs``, so ``PYTHONPATH`` alone cannot reach it: an editable install maps it
    to its own checkout's ``envs/``, and a baseline worker would step this checkout's envs."""

    def __init__(self, tree: Path) -> None:
        self.envs = tree / "envs"

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "rl_moe.envs":
            return None  # its submodules follow its __path__
        return importlib.util.spec_from_file_location(fullname, self.envs / "__init__.py", submodule_search_locations=[str(self.envs)])


if os.environ.get(TREE_VAR):  # in a worker: every script imports this module before rl_moe
    sys.meta_path.insert(0, _TreeEnvs(Path(os.environ[TREE_VAR])))


class Worker:
    """``script --worker *args`` run in ``tree`` with that tree first on the path; its first JSON
    line says which ``rl_moe`` it imported (``package``)."""

    def __init__(self, tree: Path, script: str, args: list[str]) -> None:
        env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", TREE_VAR: str(tree)}
        cmd = [sys.executable, str(HERE / script), "--worker", *args]
        self.proc = subprocess.Popen(cmd, env=env, cwd=tree, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.package = str(self._read()["ready"])

    def _read(self) -> dict:  # type: ignore[type-arg]
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"worker exited with {self.proc.wait()}")

    def ask(self, what: str) -> dict:  # type: ignore[type-arg]
        assert self.proc.stdin is not None
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


def describe(tree: Path) -> str:
    """``git describe --always --dirty`` of a checkout: the commit a worker ran, dirty or not."""
    return subprocess.run(["git", "-C", str(tree), "describe", "--always", "--dirty"], check=False, capture_output=True, text=True).stdout.strip()


def check_baseline(baseline: Path | None) -> Path:
    """``--baseline`` when it is a checkout with ``rl_moe/``; otherwise one line naming it, exit 2."""
    if baseline is None or not (baseline / "rl_moe" / "__init__.py").is_file():
        print(f"--baseline must be a checkout with rl_moe/ (got {baseline}); e.g. git worktree add --detach /tmp/rl_moe-base <commit>", file=sys.stderr)
        raise SystemExit(2)
    return baseline


def alternated(new: Worker, base: Worker, turn: Callable[[Worker], T], rounds: int) -> dict[str, list[T]]:
    """``turn`` of each worker, ``rounds`` times, in the order new base, base new, ... (a b b a), so
    that the neighbours' load hits both alike; each side's results under ``"new"`` and ``"base"``."""
    workers = {"new": new, "base": base}
    out: dict[str, list[T]] = {"new": [], "base": []}
    for r in range(rounds):
        for name in ("new", "base") if r % 2 == 0 else ("base", "new"):
            out[name].append(turn(workers[name]))
    return out


def baseline_pair(baseline: Path | None, script: str, args: list[str]) -> tuple[Worker, Worker]:
    """``script``'s worker on this checkout and on ``baseline`` (:func:`check_baseline`), in that
    order. A baseline whose worker imports this checkout's ``rl_moe`` (a ``PYTHONPATH`` or an
    editable install shadowing it) is refused: the comparison would time one commit against itself.
    """
    baseline = check_baseline(baseline)
    new, base = Worker(ROOT, script, args), Worker(baseline, script, args)
    if new.package == base.package:
        new.close()
        base.close()
        raise SystemExit(f"--baseline {baseline} imports the same rl_moe as this checkout ({new.package})")
    return new, base
