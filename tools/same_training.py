"""Do two commits train the same? Run one ``rl_moe.crl`` command from two pinned worktrees and
compare the runs' fingerprints (:mod:`rl_moe.fingerprint`: checkpoint weights, results.json's
numbers, and the TensorBoard scalars both commits log).

A results table mixes runs of two commits only where this says ``identical`` for the methods in it
(docs/results.md, "Machine, software and provenance"). Example (Top-K's slice seeds 0-3 ran at 34c7b48, seed 4 at 38279e8):

    python -m tools.same_training --out results/cw10-paper/same-training-34c7b48-38279e8.json \
        --tree ~/rl_moe-exp2 ~/venv-exp2 --tree ~/rl_moe-exp3 ~/venv-exp3 \
        -- --suite cw10-paper --method topk --tasks 2 --steps-per-task 512 --preset tiny --vec-env dummy --threads 1

A third word after a tree's venv adds arguments for that tree alone, for a commit whose defaults
another commit reaches with a flag (the authors' network was ``--preset authors`` before it became
``cw10``'s default):

    python -m tools.same_training --tree ~/rl_moe-exp ~/venv-exp "--preset authors" --tree . .venv -- --suite cw10 ...
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from rl_moe.fingerprint import fingerprint, scalars


def commit_of(tree: Path) -> str:
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, check=True).stdout.strip()
    return head + ("-dirty" if dirty else "")


def run_in(tree: Path, venv: Path, args: list[str], run_dir: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [str(venv / "bin" / "python"), "-m", "rl_moe.crl", *args, "--no-progress", "--run-dir", str(run_dir)]
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{tree}: the run failed (exit {done.returncode}): {done.stderr.strip().splitlines()[-1:]}")


def compare(runs: dict[str, Path]) -> dict[str, object]:
    """Fingerprints of each run over the scalar tags that all of them log, and whether they agree."""
    shared = set.intersection(*(set(scalars(r)) for r in runs.values()))
    prints = {name: fingerprint(r, tags=shared) for name, r in runs.items()}
    first = next(iter(prints.values()))
    same = {part: all(p[part] == first[part] for p in prints.values()) for part in first}
    return {"fingerprints": prints, "same": same, "identical": all(same.values())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tree", nargs="+", action="append", metavar="WORKTREE VENV [ARGS]", required=True,
        help="a worktree, its venv and, optionally, one quoted string of arguments for its run alone",
    )
    parser.add_argument("--out", type=Path, help="append the comparison to this JSON list")
    parser.add_argument("crl_args", nargs=argparse.REMAINDER, help="after --: the rl_moe.crl arguments (no --run-dir)")
    opts = parser.parse_args(argv)
    args = [a for a in opts.crl_args if a != "--"]
    if len(opts.tree) < 2:
        parser.error("give --tree at least twice")
    bad = [" ".join(t) for t in opts.tree if len(t) not in (2, 3)]
    if bad:
        parser.error(f"--tree takes WORKTREE VENV [ARGS], got: {bad[0]}")
    with tempfile.TemporaryDirectory() as tmp:
        runs, own = {}, {}
        for tree, venv, *extra in opts.tree:
            name = commit_of(Path(tree).expanduser())
            name += f" {extra[0]}" if extra else ""
            own[name] = shlex.split(extra[0]) if extra else []
            runs[name] = Path(tmp) / f"run{len(runs)}"
            run_in(Path(tree).expanduser(), Path(venv).expanduser(), [*args, *own[name]], runs[name])
        verdict = {"command": args, **({"tree_args": {k: v for k, v in own.items() if v}} if any(own.values()) else {}), **compare(runs)}
    print(json.dumps(verdict, indent=2))
    if opts.out:
        old = json.loads(opts.out.read_text()) if opts.out.is_file() else []
        opts.out.write_text(json.dumps([*old, verdict], indent=2) + "\n")
    return 0 if verdict["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
