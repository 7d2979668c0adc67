"""Did two runs train their first N tasks the same? A run that went on over more tasks (the slice's
runs continued over all of CW10), or one trained again from step 0 on another machine, against the
run it should repeat:

    python -m tools.same_prefix results/slice-authors-full/ppo-topk-crl-s5 results/slice-authors/ppo-topk-crl-s5 --tasks 3

Compares, over the first ``--tasks`` tasks (all that both finished, by default):

- every TensorBoard scalar either run logs before the end of task N (step < N × steps per task;
  for the scalars stepped by task index, index < N), wall-clock timings aside
  (:func:`rl_moe.fingerprint.scalars`). Points at the end step itself are
  left to the next item: there a longer run starts its next task and a shorter one logs its
  sequence-wide ``cl/*`` aggregates, which differ by design;
- results.json's evaluation curves of those tasks, and their own-segment success.

Prints one line per part and exits 0 when every part is equal, 1 otherwise; a run folder that
cannot be read or runs of different task lengths exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, NamedTuple

from rl_moe.cli import EXIT_USAGE
from rl_moe.continual.scheduler_eval import in_first_tasks
from rl_moe.fingerprint import scalars

Series = dict[str, list[tuple[int, float]]]


class Verdict(NamedTuple):
    """What :func:`compare` found: tags whose points before the end step differ (or that only one
    run logs there), the number of points compared, and the result parts that differ."""

    differing_tags: list[str]
    points: int
    differing_results: list[str]

    @property
    def same(self) -> bool:
        return not self.differing_tags and not self.differing_results


def _before(series: Series, tasks: int, steps_per_task: int) -> Series:
    """Each tag's points before the end of task ``tasks``
    (:func:`~rl_moe.continual.scheduler_eval.in_first_tasks`, the end step left out)."""
    end = tasks * steps_per_task
    cut = {tag: [(s, v) for s, v in points if in_first_tasks(tag, s, tasks, end, keep_end_step=False)] for tag, points in series.items()}
    return {tag: points for tag, points in cut.items() if points}


def compare_results(a: dict[str, Any], b: dict[str, Any], tasks: int) -> list[str]:
    """The parts of two results.json that differ over the first ``tasks`` tasks."""
    names = a["tasks"][:tasks]
    if names != b["tasks"][:tasks]:
        return ["tasks"]
    bad = [f"eval_curves[{n}]" for n in names if a["eval_curves"].get(n) != b["eval_curves"].get(n)]
    return bad + (["own_success"] if a["own_success"][:tasks] != b["own_success"][:tasks] else [])


def compare(run_a: Path, run_b: Path, tasks: int | None = None) -> Verdict:
    """Compare the first ``tasks`` tasks of two run folders (module docstring)."""
    res_a, res_b = (_results(r) for r in (run_a, run_b))
    if res_a["steps_per_task"] != res_b["steps_per_task"]:
        raise ValueError(f"the runs' tasks differ in length: {res_a['steps_per_task']} and {res_b['steps_per_task']} steps")
    finished = min(int(res_a["finished_tasks"]), int(res_b["finished_tasks"]))
    n = finished if tasks is None else tasks
    if not 1 <= n <= finished:
        raise ValueError(f"--tasks {n}: both runs have finished {finished} task(s); valid: 1 to {finished}")
    sa, sb = (_before(scalars(r), n, int(res_a["steps_per_task"])) for r in (run_a, run_b))
    differing = sorted(tag for tag in set(sa) | set(sb) if sa.get(tag) != sb.get(tag))
    return Verdict(differing, sum(len(p) for p in sa.values()), compare_results(res_a, res_b, n))


def _results(run: Path) -> dict[str, Any]:
    path = run / "results.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{str(run)!r} is not a readable run folder: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)
    parser.add_argument("--tasks", type=int, help="compare the first N tasks (default: all that both finished)")
    opts = parser.parse_args(argv)
    try:
        verdict = compare(opts.run_a, opts.run_b, opts.tasks)
    except ValueError as exc:
        print(f"same_prefix: {exc}", file=sys.stderr)
        return EXIT_USAGE
    tags = "equal" if not verdict.differing_tags else f"{len(verdict.differing_tags)} differ: {', '.join(verdict.differing_tags[:8])}"
    print(f"scalars before the end step ({verdict.points} points of run_a): {tags}")
    print(f"results.json: {'equal' if not verdict.differing_results else 'differ in ' + ', '.join(verdict.differing_results)}")
    print("same" if verdict.same else "not the same")
    return 0 if verdict.same else 1


if __name__ == "__main__":
    sys.exit(main())
