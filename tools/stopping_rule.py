"""How often issue 45's stopping rule separates two methods: add seeds one at a time from
``--start`` to ``--stop`` per method and stop as soon as the 95% CI on the IQM difference excludes
0 (or, for comparison, as soon as the permutation p is ≤ 0.05).

Each look is another chance to "separate" by luck, so the rule's error rate exceeds that of one
look at the final count. Two populations, both drawn from the committed runs (whole runs, their
tasks together, with replacement):

- **null**: both methods draw from the pooled runs of the two, so any separation is false;
- **observed**: each method draws from its own runs, so the rate is the rule's power if those runs
  are the population.

    python -m tools.stopping_rule results/cw10-paper --baseline topk --method topk_bounded \
        [--start 5 --stop 10 --sims 400 --json results/cw10-paper/stopping-rule.json]

Reads only ``results.json`` (complete runs, own-segment success), through the report's loader.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from rl_moe.cli import UsageParser
from rl_moe.report.stats import iqm_difference_ci, permutation_p
from rl_moe.report.tables import complete_scores
from tools._crl_runs import crl_runs

#: Bootstrap replicas and random splits per look (the report's power columns use the same sizes).
REPS, SPLITS = 1_000, 1_000


def separations(x: np.ndarray, y: np.ndarray, start: int, seed: int) -> tuple[list[bool], list[bool]]:
    """At each look n = ``start`` … len(x): does the CI exclude 0, and is the permutation p ≤ 0.05?
    ``x`` and ``y`` hold the runs in the order they would finish; look n uses the first n of each."""
    ci, perm = [], []
    for n in range(start, x.shape[0] + 1):
        d = iqm_difference_ci(x[:n], y[:n], reps=REPS, seed=seed + n)
        ci.append(bool(d.low > 0 or d.high < 0))
        perm.append(permutation_p(x[:n], y[:n], max_splits=SPLITS, seed=seed + n) <= 0.05)
    return ci, perm


def looks(x: np.ndarray, y: np.ndarray, start: int, seed: int) -> tuple[int | None, int | None]:
    """The first run count from ``start`` at which the CI excludes 0, and at which p ≤ 0.05
    (None where it never does)."""
    first = [next((start + i for i, hit in enumerate(hits) if hit), None) for hits in separations(x, y, start, seed)]
    return first[0], first[1]


def simulate(x_pop: np.ndarray, y_pop: np.ndarray, start: int, stop: int, sims: int, seed: int) -> dict[str, float]:
    """Rates over ``sims`` studies: separated at any look, and at the final look alone."""
    rng = np.random.default_rng(seed)
    counts = np.zeros(4)
    for k in range(sims):
        x = x_pop[rng.integers(0, x_pop.shape[0], stop)]
        y = y_pop[rng.integers(0, y_pop.shape[0], stop)]
        ci, perm = separations(x, y, start, seed=seed + 1000 * k)
        counts += (any(ci), ci[-1], any(perm), perm[-1])
    return dict(zip(("ci_any_look", "ci_final_look", "permutation_any_look", "permutation_final_look"), (counts / sims).tolist()))


def main(argv: list[str] | None = None) -> int:
    p = UsageParser(prog="python -m tools.stopping_rule", description=__doc__.splitlines()[0])
    p.add_argument("runs", type=Path, help="folder of run summaries (one suite)")
    p.add_argument("--baseline", default="topk")
    p.add_argument("--method", required=True, help="method name as the report prints it")
    p.add_argument("--start", type=int, default=5)
    p.add_argument("--stop", type=int, default=10)
    p.add_argument("--sims", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if not 2 <= args.start <= args.stop:
        p.error(f"--start {args.start} --stop {args.stop}: need 2 <= start <= stop")
    _, runs = crl_runs(p, args.runs, (args.baseline, args.method))
    x, y = complete_scores(runs[args.method]), complete_scores(runs[args.baseline])
    pooled = np.concatenate([x, y])
    out = {
        "method": args.method,
        "baseline": args.baseline,
        "runs": [int(x.shape[0]), int(y.shape[0])],
        "looks": list(range(args.start, args.stop + 1)),
        "sims": args.sims,
        "seed": args.seed,
        "null": simulate(pooled, pooled, args.start, args.stop, args.sims, args.seed),
        "observed": simulate(x, y, args.start, args.stop, args.sims, args.seed + 1),
    }
    text = json.dumps(out, indent=1)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
