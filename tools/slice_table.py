"""The per-run table of docs/results.md §8, from ``results/slice-authors``.

    python -m tools.slice_table          # rewrite the table in docs/results.md
    python -m tools.slice_table --check  # exit 1 if the docs' table differs from the data

One row per complete run, methods in the slice's order (Top-K, SPHERE, LN), then by seed: each
task's own-segment success (``results.json``'s ``own_success``: any step, the training positions)
with its held-out success on 25 positions in brackets (``positions-25.json``), and the CPU the run
trained on. Runs record that CPU in ``results.json``'s provenance from commit d12802b on; the
slice's commit predates it, so ``machines.json`` beside the runs names it for them (each run
trained on one machine: a run folder does not move between machines).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rl_moe.positions import DEFAULT_HELDOUT
from rl_moe.rundir import RunDir
from tools._doc_tables import check_or_write, replaced_table

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "results.md"
FOLDER = ROOT / "results" / "slice-authors"
#: Row order and labels of the slice's methods; any other method follows them under its own name.
METHODS = {"topk": "Top-K", "sphere": "SPHERE", "ln": "LN"}
#: Short names of the CPU models the provenance records (its ``cpu`` field), by a substring.
CPU_LABELS = {"AMD EPYC": "AMD EPYC", "Xeon": "Intel Xeon"}


def method_key(method: str) -> tuple[int, str]:
    """Sort key of a method: the slice's methods in :data:`METHODS`' order, then any other by name."""
    order = list(METHODS)
    return (order.index(method) if method in order else len(order), method)


class TableError(ValueError):
    """A run the table cannot be made from (no CPU on record)."""


def _cpu(run: Path, res: dict) -> str:
    """The CPU label of one run: from its provenance, else ``machines.json``."""
    recorded = {p["cpu"] for p in res.get("provenance", []) if p.get("cpu")}
    if len(recorded) > 1:
        raise TableError(f"{run.name}: trained on more than one CPU model: {sorted(recorded)}")
    if recorded:
        cpu = recorded.pop()
        return next((label for key, label in CPU_LABELS.items() if key in cpu), cpu)
    machines = run.parent / "machines.json"
    known = json.loads(machines.read_text()) if machines.exists() else {}
    if run.name not in known:
        raise TableError(f"{run.name}: no CPU in its provenance and none in {machines}")
    return known[run.name]


def _runs(folder: Path) -> list[tuple[Path, dict]]:
    out = []
    for path in folder.glob("*/results.json"):
        res = json.loads(path.read_text())
        if res.get("complete"):
            out.append((path.parent, res))
    return sorted(out, key=lambda r: (*method_key(r[1]["method"]), r[1]["seed"]))


def header(tasks: list[str]) -> str:
    names = [t.removesuffix("-v3") for t in tasks]
    return "| run | " + " | ".join(names) + " | CPU |\n|---|" + "---|" * len(names) + "---|\n"


def rows(folder: Path = FOLDER) -> tuple[list[str], list[str]]:
    """(tasks, one table row per complete run)."""
    runs = _runs(folder)
    if not runs:
        raise TableError(f"{folder}: no complete runs")
    tasks = runs[0][1]["tasks"]
    out = []
    for run, res in runs:
        if res["tasks"] != tasks:
            raise TableError(f"{run.name}: tasks {res['tasks']} differ from {tasks}")
        pos = RunDir(run).positions(DEFAULT_HELDOUT)
        held = json.loads(pos.read_text())["own_success_heldout"] if pos.exists() else [None] * len(tasks)
        cells = [f"{own:.2f}" + ("" if h is None else f" ({h:.2f})") for own, h in zip(res["own_success"], held)]
        label = f"{METHODS.get(res['method'], res['method'])} seed {res['seed']}"
        out.append(f"| {label} | " + " | ".join(cells) + f" | {_cpu(run, res)} |")
    return tasks, out


def table(folder: Path = FOLDER) -> str:
    tasks, body = rows(folder)
    return header(tasks) + "\n".join(body)


def replaced(doc: str, folder: Path = FOLDER) -> str:
    """``doc`` with the per-run table (from its header to the next blank line) replaced."""
    tasks, body = rows(folder)
    new = replaced_table(doc, header(tasks), header(tasks) + "\n".join(body))
    if new is None:
        raise TableError(f"the document holds no per-run table (its header: {header(tasks).splitlines()[0]})")
    return new


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="only compare; exit 1 where the docs differ from the data")
    opts = p.parse_args(argv)
    doc = DOC.read_text()
    try:
        new = replaced(doc)
    except TableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return check_or_write(DOC, doc, new, opts.check, "docs/results.md's §8 run table", "python -m tools.slice_table")


if __name__ == "__main__":
    sys.exit(main())
