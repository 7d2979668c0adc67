"""The same short CLI run under several ``--vec-env`` / ``--threads`` cells, alone and beside busy
processes, in one run.

Each cell runs ``python -m rl_moe.crl`` on one CW10 task for ``--steps`` env steps (tiny networks
would hide the update's share, so the paper's networks stay) in a fresh process, with
``OMP_NUM_THREADS`` unset so that the flags alone decide. A busy process is a Python loop spinning
on one core. Rounds alternate over the cells and the median wall time is kept. Cells:

- ``official/1``, ``official/2``, ``official/auto``: the official envs (``--vec-env dummy``);
- ``envpool/auto``: EnvPool for the whole run;
- ``auto/auto``: ``--vec-env auto``, each task on the backend it measures fastest at its start
  (its choice is printed from the run's results.json).

Prints the seconds per cell (for ``auto/auto``, its one-time measurement at the task's start is
charged at the share it has in a 1,015,808-step task, not in full: its seconds are in the run's
provenance) and, for every other cell, the ratio ``official/1``'s time over its
own (>= 1.0: never slower than the official envs at one thread). Issue targets:
``official/auto`` and ``envpool/auto`` >= 1.0 (the original table, one task), and ``auto/auto``
>= 1.0 on every CW10 task EnvPool serves at loads 1, 2 and 4 (``--tasks pool --loads 1 2 4
--cells official/1 auto/auto``). ``--set ppo.n_steps=512`` shortens a rollout to 4,096 steps with
the same minibatches per env step.

    python benchmarks/threads_under_load.py [--tasks push-wall-v3 | pool] [--steps 16384] [--rounds 2]
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
from pathlib import Path

SPIN = "while True: pass"

#: cell -> (--vec-env, --threads)
CELLS: dict[str, tuple[str, str]] = {
    "official/1": ("dummy", "1"),
    "official/2": ("dummy", "2"),
    "official/auto": ("dummy", "auto"),
    "envpool/auto": ("envpool", "auto"),
    "auto/auto": ("auto", "auto"),
}
BASE = "official/1"


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


sys.path.insert(0, os.path.dirname(__file__))
from _timing import paper_task_steps  # noqa: E402  (imports rl_moe only when called)


def run_once(suite: str, steps: int, cell: str, out: str, sets: list[str]) -> tuple[float, str]:
    """Seconds of one CLI run of the one-task ``suite`` file, ``auto``'s one-time measurement
    spread over a paper-length task (so a short run does not charge it in full), and the backend
    its task trained on."""
    vec_env, threads = CELLS[cell]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    settings = ("eval.evals_per_task=1", "eval.n_episodes=2", "eval.matrix_episodes=2", "probe.enabled=false", *sets)
    cmd = [
        sys.executable, "-m", "rl_moe.crl", "--suite", suite, "--method", "topk", "--protocol", "rl",
        "--steps-per-task", str(steps), "--threads", threads, "--vec-env", vec_env, "--no-progress", "--out", out,
        *(f for kv in settings for f in ("--set", kv)),
    ]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, capture_output=True)
    seconds = time.perf_counter() - start
    prov = json.loads(next(Path(out).rglob("results.json")).read_text())["provenance"][-1]
    measuring = float(prov.get("backend_seconds", 0.0))
    seconds += measuring * (steps / paper_task_steps() - 1.0)  # a paper-length task: 1M rounded up to whole rollouts
    chosen = prov["backend"] + (f"/{prov['pool_workers']}" if prov.get("pool_workers") else "")
    return seconds, chosen


def one_task_suite(task: str, folder: str) -> str:
    """A suite file holding CW10's ``task`` alone, under the Continual World rules (positions
    resampled, so EnvPool may serve it)."""
    from rl_moe.envs.suites import load_suite  # lazy: the parent process only launches runs

    data = load_suite("cw10-cw").to_dict()
    data["name"], data["tasks"] = f"threads-bench-{task}", [t for t in data["tasks"] if t["name"] == task]
    path = os.path.join(folder, f"{task}.json")
    with open(path, "w") as fh:
        json.dump(data, fh)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", nargs="+", default=["push-wall-v3"], help="CW10 tasks, or 'pool': the seven EnvPool serves")
    p.add_argument("--steps", type=int, default=16384, help="env steps (PPO rounds up to whole rollouts)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--loads", type=int, nargs="*", default=[0, 1, 2], help="busy processes beside the run")
    p.add_argument("--cells", nargs="+", default=["official/1", "official/2", "official/auto", "envpool/auto"], choices=list(CELLS))
    p.add_argument("--set", dest="sets", action="append", default=[], help="extra --set for every run, e.g. ppo.n_steps=512")
    args = p.parse_args()
    from rl_moe.envs.backend_choice import pool_serves  # lazy: the parent process only launches runs
    from rl_moe.envs.suites import load_suite

    cw = load_suite("cw10-cw")
    tasks = [t.name for t in cw.tasks if pool_serves(t, cw.family)] if args.tasks == ["pool"] else args.tasks
    cells = [BASE, *(c for c in args.cells if c != BASE)]
    times: dict[tuple[str, int, str], list[float]] = {(t, n, c): [] for t in tasks for n in args.loads for c in cells}
    chosen: dict[tuple[str, int], list[str]] = {(t, n): [] for t in tasks for n in args.loads}
    with tempfile.TemporaryDirectory() as tmp:
        suites = {t: one_task_suite(t, tmp) for t in tasks}
        for r in range(args.rounds):
            for n in args.loads:
                with busy(n):
                    for t in tasks:
                        for c in cells:
                            secs, backend = run_once(suites[t], args.steps, c, os.path.join(tmp, f"{r}-{n}-{t}-{c.replace('/', '_')}"), args.sets)
                            times[t, n, c].append(secs)
                            if c == "auto/auto":
                                chosen[t, n].append(backend)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.steps} env steps per run (+ start-up and evaluation), {os.cpu_count()} CPUs, median of {args.rounds} rounds; sets: {args.sets or 'none'}")
    print(f"  {'task':<22}{'busy':>5}  " + "".join(f"{c:>15}" for c in cells) + "".join(f"{c + ' vs ' + BASE:>28}" for c in cells[1:]) + ("   auto chose" if "auto/auto" in cells else ""))
    for t in tasks:
        for n in args.loads:
            secs = "".join(f"{med[t, n, c]:>14.1f}s" for c in cells)
            ratios = "".join(f"{med[t, n, BASE] / med[t, n, c]:>27.2f}x" for c in cells[1:])
            picks = f"   {', '.join(chosen[t, n])}" if "auto/auto" in cells else ""
            print(f"  {t:<22}{n:>5}  {secs}{ratios}{picks}")


if __name__ == "__main__":
    main()
