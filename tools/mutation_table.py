"""The mutation-score table of docs/contributing.md, from ``results/mutation/*.json``.

    python -m tools.mutation_table          # rewrite the table in docs/contributing.md
    python -m tools.mutation_table --check  # exit 1 if the docs' table differs from the data

Each row is one module's last ``python -m tools.mutation ... --json`` summary: its tests (and
``-k``), mutants, killed (a mutant that makes the tests time out counts as killed) and survived
(mutants no selected test reaches count as survived).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from tools._doc_tables import check_or_write, replaced_table

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "contributing.md"
HEADER = "| module | command's tests | mutants | killed | survived |\n|---|---|---:|---:|---:|\n"
#: Modules shown with what of them the score covers.
LABELS = {
    "rl_moe/regularizers/hooks.py": "`rl_moe/regularizers/hooks.py` (SPHERE's λ: `adaptive_coef`, `clamp_coef`; the loss context)",
    "rl_moe/regularizers/sphere.py": "`rl_moe/regularizers/sphere.py` (scored with its settings, `SphereConfig`, which are now in `sphere_config.py`)",
}


def rows(folder: Path = ROOT / "results" / "mutation") -> list[str]:
    """One table row per summary, the learners' modules first, then by path."""
    out = []
    for path in folder.glob("*.json"):
        d = json.loads(path.read_text())
        counts = d["counts"]
        tests = " ".join(d["tests"]) + (f" -k {shlex.quote(d['keyword'])}" if d.get("keyword") else "")  # quoted: the cell is a command line
        survived = counts.get("survived", 0) + counts.get("no tests", 0)
        killed = counts.get("killed", 0) + counts.get("timeout", 0)  # a mutant that hangs the tests is caught
        label = LABELS.get(d["module"], f"`{d['module']}`")
        key = (not d["module"].startswith("rl_moe/algos/"), d["module"])
        out.append((key, f"| {label} | `{tests}` | {d['mutants']} | {killed} | {survived} |"))
    return [row for _, row in sorted(out)]


def table() -> str:
    return HEADER + "\n".join(rows())


def replaced(doc: str) -> str:
    """``doc`` with its mutation table (from the header to the next blank line) replaced."""
    new = replaced_table(doc, HEADER, table())
    if new is None:
        raise ValueError(f"{DOC} holds no mutation table (its header: {HEADER.splitlines()[0]})")
    return new


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="only compare; exit 1 where the docs differ from the data")
    opts = p.parse_args(argv)
    doc = DOC.read_text()
    new = replaced(doc)
    return check_or_write(DOC, doc, new, opts.check, "docs/contributing.md's mutation table", "python -m tools.mutation_table")


if __name__ == "__main__":
    sys.exit(main())
