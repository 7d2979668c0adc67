"""A small sweep on each backend, alone and beside busy processes, in one run: does a Ray sweep
keep up with the local backend when the machine is not idle?

Ray's workers raise their niceness by 15 unless told otherwise, and a trial's process
inherits it, so beside a busy process its trials get a sliver of a core. The sweep starts its own
cluster with ``RAY_worker_niceness=0`` (rl_moe.sweep.backends). Cells:

- ``local``: ``--backend local`` (subprocesses at the sweep's own priority), the reference;
- ``ray``: ``--backend ray``, a cluster the sweep starts (worker niceness 0);
- ``ray/nice15``: the same with ``RAY_worker_niceness=15`` set, which is Ray's own default.

Each cell runs the same grid of ``--seeds`` smoke-suite trials with ``--num-cpus`` CPUs, in a
fresh folder, beside ``--loads`` busy processes (a Python loop spinning a core each). Prints the
seconds per cell and each Ray cell's time over ``local``'s at the same load. Target: ``ray`` within
1.5x of ``local`` at every load (Ray's start-up, several seconds, is part of its time).

    python benchmarks/sweep_under_load.py [--steps 2048] [--seeds 0 1] [--loads 0 2] [--rounds 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from threads_under_load import busy  # noqa: E402

#: cell -> (--backend, extra environment)
CELLS: dict[str, tuple[str, dict[str, str]]] = {
    "local": ("local", {}),
    "ray": ("ray", {}),
    "ray/nice15": ("ray", {"RAY_worker_niceness": "15"}),
}
BASE = "local"


def sweep_seconds(cell: str, steps: int, seeds: list[str], num_cpus: int, out: str) -> float:
    """Wall seconds of one ``python -m rl_moe.sweep`` of smoke-suite Top-K trials on ``cell``."""
    backend, extra = CELLS[cell]
    env = {k: v for k, v in os.environ.items() if k != "RAY_worker_niceness"} | {"OMP_NUM_THREADS": "1", **extra}
    cmd = [
        sys.executable, "-m", "rl_moe.sweep", "--suite", "smoke", "--method", "topk", "--seed", *seeds,
        "--backend", backend, "--num-cpus", str(num_cpus), "--out", out,
        "--steps-per-task", str(steps), "--tasks", "1", "--", "--set", "probe.enabled=false", "--set", "eval.evals_per_task=1",
    ]  # fmt: skip
    start = time.perf_counter()
    run = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"{cell}: the sweep exited {run.returncode}:\n{run.stderr}")
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2048, help="env steps asked of each trial's one smoke task (PPO rounds up to whole rollouts: 256 -> 1,024)")
    p.add_argument("--seeds", nargs="+", default=["0", "1"], help="one trial per seed")
    p.add_argument("--num-cpus", type=int, default=2, help="CPUs of the sweep (--num-cpus): trials side by side")
    p.add_argument("--loads", type=int, nargs="+", default=[0, 2], help="busy processes beside the sweep")
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args()
    times: dict[tuple[int, str], list[float]] = {(n, c): [] for n in args.loads for c in CELLS}
    cells = list(CELLS)
    for r in range(args.rounds):
        for n in args.loads:
            with busy(n):
                for cell in cells[r % len(cells) :] + cells[: r % len(cells)]:  # rotated: no cell always starts cold
                    with tempfile.TemporaryDirectory() as out:
                        times[n, cell].append(sweep_seconds(cell, args.steps, args.seeds, args.num_cpus, out))
    print(f"{len(args.seeds)} smoke trials of {args.steps} steps asked, {args.num_cpus} side by side, {os.cpu_count()} cores; seconds (median of {args.rounds})")
    others = [c for c in CELLS if c != BASE]
    print(f"  {'busy':>4}" + "".join(f"{c:>12}" for c in CELLS) + "".join(f"{c + ' / ' + BASE:>20}" for c in others))
    for n in args.loads:
        med = {c: statistics.median(times[n, c]) for c in CELLS}
        print(f"  {n:>4}" + "".join(f"{med[c]:>12.1f}" for c in CELLS) + "".join(f"{med[c] / med[BASE]:>20.2f}" for c in others))


if __name__ == "__main__":
    main()
