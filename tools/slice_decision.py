"""The decision rule of docs/results.md §8, applied to a folder of slice runs.

    python -m tools.slice_decision results/slice-authors [--baseline topk --method sphere] [--json FILE]

The statistic is the IQM of own-segment success over run × task cells (any step, the training
positions) and the difference method − baseline with its 95% stratified-bootstrap CI at the report's
verdict replicas. The rule looks at 5 complete seeds per method, and at 10 when the first look asks
for more; a look takes each method's lowest seeds. Complete runs beyond the look that decided (on
either side) are given as estimates (the difference over all complete runs, its CI and the
permutation p over whole runs, for own-segment and for held-out success), which do not re-decide.

1. **reproduces**: the difference is ≥ 0.2 and its CI excludes 0;
2. **grow to 10 seeds**: at the first look, the difference is ≥ 0.2 and the CI includes 0;
3. **did not reproduce**: otherwise (at the second look, 2 also ends here), with the rule's power at
   the observed spread: the share of simulated studies of the look's size, drawn from each method's
   observed runs with the method's shifted by a constant so that the populations' IQM difference is
   the paper's 0.44 (Table 14: 0.89 − 0.45), in which rule 1 fires. ``--paper-difference`` sets that
   difference for another task list (all of CW10: 0.28, the paper's 0.49 − 0.21).

At every look the rule's power at the observed spread (as in 3) is printed too, whatever the
verdict, so that a "reproduces" states how often the rule would have fired had the paper's
difference been the truth. Beside it, the rule's false-firing rate: how often rule 1 fires in
simulated studies of the look's size whose two methods are both drawn from the pooled runs of the
two (equal methods at the observed spread). Fewer than 5 complete seeds on either side decide nothing: the values
are printed as an observation.
Reads only ``results.json`` (complete runs), through the report's loader.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from rl_moe.cli import UsageParser
from rl_moe.report.stats import SEPARATION_SIMS, TIE_TOLERANCE, VERDICT_REPS, iqm, iqm_difference_ci, permutation_p, power_to_separate
from rl_moe.report.tables import complete_scores
from tools._crl_runs import crl_runs

#: The looks, in complete seeds per method; the last one is final.
LOOKS = (5, 10)
#: The verdict that asks for the next look.
GROW = f"grow to {LOOKS[-1]} seeds"
#: The smallest IQM difference the rule calls a gain.
MIN_GAIN = 0.2
#: The paper's difference on the slice (SPHERE 0.89 against Top-K 0.45, Table 14): the true
#: difference the power is computed at.
PAPER_DIFFERENCE = 0.44


@dataclass(frozen=True)
class Decision:
    """What the rule says about one pair of score matrices."""

    verdict: str  # "observation", "reproduces", "grow to 10 seeds" or "did not reproduce"
    look: int | None  # seeds per method the verdict used (None: an observation, all seeds used)
    runs: tuple[int, int]  # complete runs of (method, baseline) used
    iqm: tuple[float, float]  # (method, baseline)
    difference: float
    ci: tuple[float, float]
    power: float | None  # the rule's power at the observed spread (rule 3's); None for an observation
    false_firing: float | None  # how often rule 1 fires between equal methods (runs pooled); None for an observation


def decide(x: np.ndarray, y: np.ndarray, sims: int = SEPARATION_SIMS, seed: int = 0, paper_difference: float = PAPER_DIFFERENCE) -> Decision:
    """§8's rule on (runs, tasks) scores of the method ``x`` and the baseline ``y``, each in seed
    order (a look takes the first rows). The looks are sequential: a later look is taken only when
    the one before it asked for more seeds, so runs beyond a deciding look do not re-decide. The
    power is computed at a true IQM difference of ``paper_difference``."""
    n = min(len(x), len(y))
    if n < LOOKS[0]:
        return _at_look(x, y, None, sims, seed, paper_difference)
    for look in (k for k in LOOKS if k <= n):
        d = _at_look(x[:look], y[:look], look, sims, seed, paper_difference)
        if d.verdict != GROW:
            break
    return d


def estimate(x: np.ndarray, y: np.ndarray, seed: int = 0) -> dict[str, object]:
    """The IQM difference over all the runs given, its 95% stratified-bootstrap CI and the
    permutation p over whole runs: an estimate beside the decision, never a look."""
    d = iqm_difference_ci(x, y, reps=VERDICT_REPS, seed=seed)
    return {"runs": [len(x), len(y)], "difference": d.value, "ci": [d.low, d.high], "permutation_p": permutation_p(x, y, seed=seed)}


def beyond_decision(d: Decision, n_method: int, n_baseline: int) -> bool:
    """Whether either method has complete runs beyond the look that decided (a look that asked
    for more seeds decided nothing, and an observation is no look): then estimates follow."""
    return d.look is not None and d.verdict != GROW and max(n_method, n_baseline) > d.look


def _at_look(x: np.ndarray, y: np.ndarray, look: int | None, sims: int, seed: int, paper_difference: float) -> Decision:
    """The rule at one look (``look`` seeds per method; None: an observation of all the runs)."""
    d = iqm_difference_ci(x, y, reps=VERDICT_REPS, seed=seed)
    values = dict(look=look, runs=(len(x), len(y)), iqm=(float(iqm(x)), float(iqm(y))), difference=d.value, ci=(d.low, d.high))
    if look is None:
        return Decision("observation", power=None, false_firing=None, **values)  # type: ignore[arg-type]
    shifted = x + (paper_difference - (iqm(x) - iqm(y)))
    power = power_to_separate(shifted, y, look, sims=sims, seed=seed, min_difference=MIN_GAIN)
    pooled = np.vstack([x, y])
    false_firing = power_to_separate(pooled, pooled, look, sims=sims, seed=seed, min_difference=MIN_GAIN)
    gain = d.value >= MIN_GAIN - TIE_TOLERANCE
    if gain and d.low > 0:
        verdict = "reproduces"
    elif gain and look != LOOKS[-1]:
        verdict = GROW
    else:
        verdict = "did not reproduce"
    return Decision(verdict, power=power, false_firing=false_firing, **values)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    p = UsageParser(prog="python -m tools.slice_decision", description=__doc__.splitlines()[0])
    p.add_argument("runs", type=Path, help="folder of run summaries (one suite)")
    p.add_argument("--baseline", default="topk", help="the method compared against (default topk)")
    p.add_argument("--method", default="sphere", help="the method under test, as its runs record it (sphere, ln, ...; default sphere)")
    p.add_argument("--sims", type=int, default=SEPARATION_SIMS, help="simulated studies behind the power")
    p.add_argument("--paper-difference", type=float, default=PAPER_DIFFERENCE,
                   help=f"the true IQM difference the power is computed at (default {PAPER_DIFFERENCE}, the paper's on the slice; all of CW10: 0.28)")
    p.add_argument("--json", type=Path, default=None, help="also write the decision here")
    args = p.parse_args(argv)
    if args.sims < 1:
        p.error(f"--sims {args.sims}: need an integer >= 1")
    if not 0 < args.paper_difference <= 1:
        p.error(f"--paper-difference {args.paper_difference}: need a success difference in (0, 1]")
    suite, runs = crl_runs(p, args.runs, (args.baseline, args.method))
    ordered = [sorted(runs[m], key=lambda r: r.seed) for m in (args.method, args.baseline)]
    x, y = (complete_scores(r) for r in ordered)
    d = decide(x, y, sims=args.sims, paper_difference=args.paper_difference)
    (mx, by) = d.iqm
    used = f"{d.runs[0]} and {d.runs[1]}" if d.runs == (len(x), len(y)) else f"{d.runs[0]} of {len(x)} and {d.runs[1]} of {len(y)}"
    print(f"{suite} CRL, {args.method} against {args.baseline}: {used} complete runs" + (f" (the {d.look}-seed look)" if d.look else ""))
    print(f"  IQM {mx:.3f} against {by:.3f}; difference {d.difference:+.3f} [95% CI {d.ci[0]:+.3f}, {d.ci[1]:+.3f}]")
    line = f"  verdict: {d.verdict}"
    if d.verdict == "observation":
        line += f" (the rule decides at {LOOKS[0]} complete seeds per method)"
    if d.power is not None:
        line += (f"; the rule's power at the observed spread (how often it finds a gain when the true difference is {args.paper_difference}):"
                 f" {d.power:.2f} ({args.sims} simulated {d.look}-seed studies)")
    print(line)
    if d.false_firing is not None:
        print(f"  between equal methods (both methods' runs pooled) the rule fires in {d.false_firing:.2f} of {args.sims} simulated studies")
    extra: dict[str, object] | None = None
    if beyond_decision(d, len(x), len(y)):
        held = [complete_scores(r, "heldout") for r in ordered]
        extra = {"own": estimate(x, y), "heldout": estimate(*held) if min(map(len, held)) else None}
        print("  estimates over all complete runs (not a look; the verdict above stands):")
        for name, e in extra.items():
            if e is not None:
                (lo, hi), (n_x, n_y) = e["ci"], e["runs"]  # type: ignore[index]
                print(f"    {name}: {n_x} and {n_y} runs, difference {e['difference']:+.3f} [95% CI {lo:+.3f}, {hi:+.3f}], "  # type: ignore[index]
                      f"permutation p {e['permutation_p']:.3f}")  # type: ignore[index]  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps({"method": args.method, "baseline": args.baseline, "paper_difference": args.paper_difference, **asdict(d), "estimate": extra}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
