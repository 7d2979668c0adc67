"""rl_moe.report.plasticity: diagnostics per task and their difference from the baseline, checked
against hand-computed segment means, scipy's trimmed mean and a brute-force permutation test."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import trim_mean

from rl_moe.report.runs import Run, RunKey
from rl_moe.report.plasticity import DIAGNOSTICS, diagnostic_matrix, plasticity_table
from rl_moe.report.scalars import Curve
from rl_moe.report.tables import Context

RANK = "plasticity/entk_rank"


def run(method: str, seed: int, complete: bool = True) -> Run:
    """A two-task CRL run of 200 steps per task (segments (0, 200] and (200, 400])."""
    nan = float("nan")
    own = (1.0, 0.0) if complete else (1.0, nan)
    return Run(Path(f"{method}-s{seed}"), RunKey("smoke", "ppo", method, "crl"), seed, ("a", "b"), 200, complete, own, (nan, nan), ((1.0, nan), (nan, nan)), segments=((0, 200), (200, 400)) if complete else ((0, 200),))


def probes(values: list[float]) -> Curve:
    """r_e(K) probed at steps 100, 200, 300, 400: the first two in task a, the last two in task b."""
    return Curve(np.array([100.0, 200.0, 300.0, 400.0]), np.array(values))


def brute_force_p(x: np.ndarray, y: np.ndarray) -> float:
    """Two-sided permutation p of the difference of trimmed means, every split of whole runs."""
    pooled = np.concatenate([x, y])
    observed = abs(trim_mean(x.ravel(), 0.25) - trim_mean(y.ravel(), 0.25))
    hits = total = 0
    for group in itertools.combinations(range(len(pooled)), len(x)):
        rest = [i for i in range(len(pooled)) if i not in group]
        stat = trim_mean(pooled[list(group)].ravel(), 0.25) - trim_mean(pooled[rest].ravel(), 0.25)
        hits += abs(stat) >= observed - 1e-9
        total += 1
    return hits / total


def test_a_diagnostic_is_the_mean_of_each_tasks_own_probes_over_complete_runs() -> None:
    runs = [run("topk", 0), run("topk", 1), run("topk", 2, complete=False), run("topk", 3)]
    scalars = {
        runs[0].path: {RANK: probes([4.0, 2.0, 9.0, 5.0])},
        runs[1].path: {RANK: probes([1.0, 1.0, 3.0, 3.5])},
        runs[2].path: {RANK: probes([6.0, 6.0, 6.0, 6.0])},  # unfinished: left out
        runs[3].path: {RANK: Curve(np.array([100.0, 200.0]), np.array([5.0, 5.0]))},  # nothing in task b: left out
    }
    m = diagnostic_matrix(runs, scalars, RANK)
    # the probe at step 200 ends task a, so it is task a's
    assert m.tolist() == [[3.0, 7.0], [1.0, 3.25]]
    assert diagnostic_matrix(runs, {}, RANK).shape == (0, 2)


def test_the_table_gives_the_trimmed_mean_difference_its_ci_and_the_exact_permutation_p() -> None:
    rng = np.random.default_rng(3)
    base = rng.normal(4.0, 1.0, size=(3, 4))  # per-probe values of 3 Top-K runs (2 probes per task)
    other = rng.normal(6.0, 1.5, size=(4, 4))
    runs = {"topk": [run("topk", s) for s in range(3)], "sphere": [run("sphere", s) for s in range(4)]}
    scalars = {r.path: {RANK: probes(v.tolist())} for m, values in (("topk", base), ("sphere", other)) for r, v in zip(runs[m], values)}
    ctx = Context("smoke", "ppo", ("a", "b"), 200, {"crl": {m: tuple(r) for m, r in runs.items()}}, {})
    table = plasticity_table(ctx, "crl", scalars, "topk", "sphere", reps=2000)
    assert table is not None
    rows = {(r[0], r[1]): r for r in table.rows}
    label = next(d.label for d in DIAGNOSTICS if d.tag == RANK)
    assert set(rows) == {(label, "topk"), (label, "sphere")}  # the other diagnostics were not logged
    # per-task means of each run, as diagnostic_matrix must have taken them
    x = (other[:, [0, 2]] + other[:, [1, 3]]) / 2
    y = (base[:, [0, 2]] + base[:, [1, 3]]) / 2
    top, sph = rows[(label, "topk")], rows[(label, "sphere")]
    assert top[2] == "3" and sph[2] == "4"
    assert sph[3] == f"{x[:, 0].mean():.2f} ± {x[:, 0].std():.2f}"
    assert sph[5] == f"{trim_mean(x.ravel(), 0.25):.2f}" and top[5] == f"{trim_mean(y.ravel(), 0.25):.2f}"
    point = trim_mean(x.ravel(), 0.25) - trim_mean(y.ravel(), 0.25)
    diff, low, high = (float(v) for v in sph[6].replace("[", "").replace("]", "").replace(",", "").split())
    assert diff == pytest.approx(point, abs=0.006) and low <= diff <= high
    assert float(sph[7]) == pytest.approx(brute_force_p(x, y), abs=5e-4)  # C(7, 4) = 35 splits: all enumerated
    assert top[6:] == ("—", "—")


def test_no_logged_diagnostic_gives_no_table() -> None:
    runs = {"topk": [run("topk", 0)]}
    ctx = Context("smoke", "ppo", ("a", "b"), 200, {"crl": {m: tuple(r) for m, r in runs.items()}}, {})
    assert plasticity_table(ctx, "crl", {}, "topk", "sphere", reps=100) is None


def test_a_p_value_that_rounds_to_zero_is_written_as_a_bound() -> None:
    from rl_moe.report.stats import fmt_p

    assert [fmt_p(p) for p in (0.0004, 0.0005001, 0.001, 0.795)] == ["< 0.001", "0.001", "0.001", "0.795"]
