"""The same short CLI run with ``--threads auto``, ``1`` and ``2``, on the official envs and on
EnvPool, alone and beside one and two busy processes, in one run.

Each cell runs ``python -m rl_moe.crl`` on one CW10 task for ``--steps`` env steps (tiny networks
would hide the update's share, so the paper's networks and rollouts stay) in a fresh process, with
``OMP_NUM_THREADS`` unset so that ``--threads`` alone decides. A busy process is a Python loop
spinning on one core. Rounds alternate over the cells and the median wall time is kept. Prints the
seconds per cell and the two ratios the targets are on:

- ``auto / 1``: ``--threads 1``'s time over ``auto``'s on the official envs (target >= 1.0 in
  every load column);
- ``envpool / official``: the official envs' time over EnvPool's, each under ``auto`` (target
  >= 1.0 in every load column).

    python benchmarks/threads_under_load.py [--task push-wall-v3] [--steps 16384] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

SPIN = "while True: pass"


@contextmanager
def busy(n: int) -> Iterator[None]:
    """``n`` processes spinning on a core each, for the duration."""
    procs = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(n)]
    try:
        time.sleep(1.0 if n else 0.0)
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def run_once(suite: str, steps: int, threads: str, vec_env: str, out: str) -> float:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    cmd = [
        sys.executable, "-m", "rl_moe.crl", "--suite", suite, "--method", "topk", "--protocol", "rl",
        "--steps-per-task", str(steps), "--threads", threads, "--vec-env", vec_env, "--no-progress", "--out", out,
        *(f for kv in ("eval.evals_per_task=1", "eval.n_episodes=2", "eval.matrix_episodes=2", "probe.enabled=false") for f in ("--set", kv)),
    ]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="push-wall-v3", help="a CW10 task EnvPool serves (default push-wall-v3)")
    p.add_argument("--steps", type=int, default=16384, help="env steps (PPO rounds up to whole 16,384-step rollouts)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--loads", type=int, nargs="*", default=[0, 1, 2], help="busy processes beside the run")
    args = p.parse_args()
    from rl_moe.envs.suites import load_suite  # lazy: the parent process only launches runs

    data = load_suite("cw10-cw").to_dict()
    data["name"], data["tasks"] = "threads-bench", [t for t in data["tasks"] if t["name"] == args.task]
    cells = [("official", "1"), ("official", "2"), ("official", "auto"), ("envpool", "auto")]
    times: dict[tuple[int, str, str], list[float]] = {(n, b, t): [] for n in args.loads for b, t in cells}
    with tempfile.TemporaryDirectory() as tmp:
        suite = os.path.join(tmp, "suite.json")
        with open(suite, "w") as fh:
            json.dump(data, fh)
        for r in range(args.rounds):
            for n in args.loads:
                with busy(n):
                    for b, t in cells:
                        vec = "dummy" if b == "official" else "envpool"
                        times[n, b, t].append(run_once(suite, args.steps, t, vec, os.path.join(tmp, f"{r}-{n}-{b}-{t}")))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.task}, {args.steps} env steps per run (+ start-up and evaluation), {os.cpu_count()} CPUs, median of {args.rounds} rounds")
    print(f"  {'busy':>4}  " + "  ".join(f"{b}/{t:>4}" for b, t in cells) + "   auto/1 (official)   envpool/official (auto)")
    for n in args.loads:
        secs = "  ".join(f"{med[n, b, t]:>12.1f}" for b, t in cells)
        auto_vs_1 = med[n, "official", "1"] / med[n, "official", "auto"]
        pool_vs_off = med[n, "official", "auto"] / med[n, "envpool", "auto"]
        print(f"  {n:>4}  {secs}   {auto_vs_1:>17.2f}x   {pool_vs_off:>22.2f}x")


if __name__ == "__main__":
    main()
