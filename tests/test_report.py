"""Report: known-answer tables, robust statistics, CL metrics, plots and user errors."""

from __future__ import annotations

import itertools
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rl_moe.continual.metrics import compute_cl_metrics, forward_transfer
from rl_moe.report import ReportError, ReportOptions, build_report, load_runs
from rl_moe.report.__main__ import main
from rl_moe.report.scalars import Curve, load_scalars, seed_band
from rl_moe.report.stats import (
    cl_metrics,
    iqm,
    iqm_ci,
    probability_of_improvement,
    probability_of_improvement_ci,
    task_auc,
)
from rl_moe.report.tables import budget_note, contexts, per_task, reference_tasks, rl_crl_gap, robust, run_cl_metrics

TASKS = ["reach", "push", "pick"]
SPT = 100
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# own-segment success per (method, protocol, seed); known numbers the tables must reproduce
OWN = {
    ("topk", "crl"): {0: [1.0, 0.0, 0.5], 1: [0.5, 0.0, 0.5]},
    ("sphere", "crl"): {0: [1.0, 0.5, 1.0], 1: [1.0, 1.0, 0.5]},
    ("topk", "rl"): {0: [1.0, 1.0, 0.5], 1: [1.0, 0.5, 0.5]},
    ("sphere", "rl"): {0: [1.0, 1.0, 1.0], 1: [1.0, 0.5, 1.0]},
}


def results(method: str, protocol: str, seed: int, own: list[float], **over: object) -> dict:
    """A complete schema-1 results.json: final = own minus a forgetting of 0.5·own on earlier tasks."""
    n = len(own)
    final = [own[j] * (0.5 if j < n - 1 else 1.0) for j in range(n)] if protocol == "crl" else [None] * n
    matrix = [[own[j] if j == i else None for j in range(n)] for i in range(n)]
    if protocol == "crl":
        matrix[-1] = final
    curves = {t: {"steps": [i * SPT + 50, (i + 1) * SPT], "success": [0.0, own[i]]} for i, t in enumerate(TASKS[:n])}
    data = {
        "schema": 1, "suite": "smoke", "algo": "ppo", "method": method, "protocol": protocol, "seed": seed,
        "tasks": TASKS[:n], "steps_per_task": SPT, "finished_tasks": n, "complete": True,
        "success_matrix": matrix, "own_success": own, "final_success": final, "eval_curves": curves,
        "cl_metrics": {"average_performance": 0.0, "forgetting": 0.0, "forward_transfer": None},
    }
    data.update(over)
    return data


def write_run(root: Path, data: dict, scalars: dict[str, list[tuple[int, float]]] | None = None) -> Path:
    """A run folder with results.json and, optionally, a TensorBoard event file in tb/."""
    folder = root / data["suite"] / f"{data['algo']}-{data['method']}-{data['protocol']}-s{data['seed']}"
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps(data))
    if scalars:
        from torch.utils.tensorboard import SummaryWriter

        with SummaryWriter(str(folder / "tb")) as w:
            for tag, points in scalars.items():
                for step, value in points:
                    w.add_scalar(tag, value, step)
    return folder


def entk(method: str, seed: int) -> list[tuple[int, float]]:
    # r_e(K) decays for topk, stays flat for sphere; the seed shifts it by ±1
    slope = -0.02 if method == "topk" else 0.0
    return [(s, 20.0 + slope * s + (1 if seed else -1)) for s in range(0, 301, 50)]


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    for (method, protocol), seeds in OWN.items():
        for seed, own in seeds.items():
            tb = {"plasticity/entk_rank": entk(method, seed), "plasticity/dormant_ratio": [(0, 0.1), (300, 0.2 + seed * 0.1)]}
            write_run(root, results(method, protocol, seed, own), tb if protocol == "crl" else None)
    return root


@pytest.fixture(scope="module")
def report(runs_root: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("report")
    assert main([str(runs_root), "--out", str(out), "--reps", "2000"]) == 0
    return out, (out / "report.md").read_text()


def table_row(md: str, caption_part: str, label: str) -> list[str]:
    """Cells of the row ``label`` in the first table whose caption contains ``caption_part``."""
    block = md[md.index(caption_part):]
    block = block[: block.index("\n\n", block.index("|"))]
    for line in block.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] == label:
            return cells[1:]
    raise AssertionError(f"row {label!r} not found under {caption_part!r}")


# --- tables -------------------------------------------------------------------------------------

def test_per_task_mean_std_known_values(runs_root: Path) -> None:
    runset = load_runs([runs_root])
    ctx = contexts(runset)[0]
    pt = per_task(ctx.runs["crl"]["topk"])
    assert [c.mean for c in pt.cells] == pytest.approx([0.75, 0.0, 0.5])
    assert [c.std for c in pt.cells] == pytest.approx([0.25, 0.0, 0.0])  # ddof=0 like the paper
    # per-seed averages 0.5 and 1/3
    assert pt.average.mean == pytest.approx(5 / 12) and pt.average.std == pytest.approx(1 / 12)


def test_report_tables_match_hand_computed(report: tuple[Path, str]) -> None:
    _, md = report
    crl = "smoke / ppo / CRL: success right after"
    assert table_row(md, crl, "reach") == ["0.75 ± 0.25", "1.00 ± 0.00"]  # columns: topk, sphere
    assert table_row(md, crl, "average") == ["0.42 ± 0.08", "0.83 ± 0.00"]
    rl = "smoke / ppo / RL: success right after"
    assert table_row(md, rl, "push") == ["0.75 ± 0.25", "0.75 ± 0.25"]
    # gap table: topk RL, CRL, gap then sphere RL, CRL, gap; push: topk 0.75-0 ; sphere 0.75-0.75
    assert table_row(md, "RL vs CRL", "push") == ["0.75", "0.00", "0.75", "0.75", "0.75", "0.00"]
    # final checkpoint: topk s0 final [0.5, 0, 0.5], s1 [0.25, 0, 0.5]
    assert table_row(md, "final-checkpoint success", "reach") == ["0.38 ± 0.12", "0.50 ± 0.00"]


def test_paper_columns_next_to_cw10_tasks(tmp_path: Path) -> None:
    # A CW10 prefix under CRL gets Table 14's columns; a slice's paper average is left blank.
    tasks = ["hammer-v3", "push-wall-v3", "faucet-close-v3"]
    for method, seed in itertools.product(("topk", "sphere"), (0, 1)):
        data = results(method, "crl", seed, [1.0, 0.0, 0.5], suite="cw10-cw", tasks=tasks,
                       eval_curves={t: {"steps": [i * SPT + 50, (i + 1) * SPT], "success": [0.0, 1.0]} for i, t in enumerate(tasks)})
        write_run(tmp_path / "runs", data)
    # RL on tasks out of CW10's order is still Table 13.
    rl_tasks = ["faucet-close-v3", "handle-press-side-v3", "window-close-v3"]
    write_run(tmp_path / "runs", results("topk", "rl", 0, [1.0, 1.0, 0.9], suite="mw3", tasks=rl_tasks,
                                         eval_curves={t: {"steps": [SPT], "success": [1.0]} for t in rl_tasks}))
    out = tmp_path / "report"
    assert main([str(tmp_path / "runs"), "--out", str(out), "--reps", "200"]) == 0
    md = (out / "report.md").read_text()
    crl = "cw10-cw / ppo / CRL: success right after"
    header = [c.strip() for c in md[md.index(crl):].split("\n")[2].strip("|").split("|")]
    assert header == ["task", "topk (n=2)", "sphere (n=2)", "paper: topk (n=5)", "paper: sphere (n=5)"]
    assert table_row(md, crl, "push-wall-v3") == ["0.00 ± 0.00", "0.00 ± 0.00", "0.00 ± 0.00", "0.70 ± 0.25"]
    assert table_row(md, crl, "faucet-close-v3")[2:] == ["0.38 ± 0.47", "1.00 ± 0.00"]
    assert table_row(md, crl, "average")[2:] == ["—", "—"]
    caption = md[md.index(crl):].split("\n")[0]
    assert "SPHERE Table 14" in caption and f"**{SPT:,} steps per task (paper: 1,000,000): below the paper's budget, not comparable**" in caption
    assert table_row(md, "mw3 / ppo / RL: success right after", "window-close-v3") == ["0.90", "1.00 ± 0.00"]
    # At the paper's budget the caption names it without the flag (tables.budget_note).
    assert budget_note(1_015_808) == "1,015,808 steps per task (paper: 1,000,000)"
    # The final-checkpoint table has no paper columns.
    assert len(table_row(md, "cw10-cw / ppo / CRL: final-checkpoint", "hammer-v3")) == 2


def test_rl_crl_gap_and_headline(runs_root: Path, report: tuple[Path, str]) -> None:
    ctx = contexts(load_runs([runs_root]))[0]
    gap = rl_crl_gap(ctx.runs["rl"]["topk"], ctx.runs["crl"]["topk"])
    # RL per-seed averages 5/6, 2/3 -> 0.75; CRL 5/12
    assert gap.gap_avg == pytest.approx(0.75 - 5 / 12)
    sphere = rl_crl_gap(ctx.runs["rl"]["sphere"], ctx.runs["crl"]["sphere"])
    assert sphere.gap_avg == pytest.approx((1 + 5 / 6) / 2 - 5 / 6)
    reduction = 1 - sphere.gap_avg / gap.gap_avg  # 1 - (1/12)/(1/3) = 75%
    assert reduction == pytest.approx(0.75)
    assert "gap reduction 75%" in report[1]
    assert "relative change +100%" in report[1]  # CRL: sphere 5/6 vs topk 5/12


def test_html_has_same_tables(report: tuple[Path, str]) -> None:
    out, _ = report
    page = (out / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("<table>") >= 6
    assert "<td>0.75 ± 0.25</td>" in page


# --- robust statistics --------------------------------------------------------------------------

def test_iqm_hand_computed_and_trim_mean() -> None:
    assert iqm(np.array([[1.0, 0.0, 0.5], [0.5, 0.0, 0.5]])) == pytest.approx(0.375)  # middle [0,.5,.5,.5]
    assert iqm(np.arange(8.0)) == pytest.approx(3.5)  # drops 0,1 and 6,7
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(1)
    for n in (4, 5, 7, 10, 50):
        x = rng.random(n)
        assert iqm(x) == pytest.approx(scipy_stats.trim_mean(x, 0.25))


def brute_poi(x: np.ndarray, y: np.ndarray) -> float:
    per_task = []
    for t in range(x.shape[1]):
        s = [1.0 if a > b else 0.5 if a == b else 0.0 for a, b in itertools.product(x[:, t], y[:, t])]
        per_task.append(sum(s) / len(s))
    return float(np.mean(per_task))


def test_probability_of_improvement_known_and_brute_force() -> None:
    x = np.array([[1.0, 0.5], [0.5, 0.5]])
    y = np.array([[0.5, 0.5], [0.0, 1.0]])
    # task 0: pairs (1>.5,1>0,.5=.5,.5>0) = 3.5/4; task 1: (.5=.5,.5<1,.5=.5,.5<1) = 1/4
    assert probability_of_improvement(x, y) == pytest.approx((3.5 / 4 + 1 / 4) / 2)
    rng = np.random.default_rng(0)
    for _ in range(5):
        a, b = rng.integers(0, 3, (4, 3)) / 2, rng.integers(0, 3, (6, 3)) / 2
        assert probability_of_improvement(a, b) == pytest.approx(brute_poi(a, b))
    same = probability_of_improvement_ci(x, x, reps=500)
    assert same.value == pytest.approx(0.5) and same.low <= 0.5 <= same.high


def test_bootstrap_is_stratified_by_task() -> None:
    # each task column is constant across runs: resampling runs within a task changes nothing,
    # so a stratified bootstrap has a zero-width CI (an unstratified one would not)
    scores = np.tile([0.0, 0.2, 0.9, 1.0], (5, 1))
    ci = iqm_ci(scores, reps=1000)
    assert ci.value == ci.low == ci.high == pytest.approx(iqm(scores))
    noisy = np.random.default_rng(0).random((5, 4))
    ci = iqm_ci(noisy, reps=2000)
    assert ci.low < ci.value < ci.high


def test_robust_aggregates_in_report(runs_root: Path, report: tuple[Path, str]) -> None:
    ctx = contexts(load_runs([runs_root]))[0]
    res = robust(ctx, "crl", "topk", reps=500)
    assert res["topk"].iqm.value == pytest.approx(0.375)
    # sphere (6 scores: 1,.5,1,1,1,.5) sorted .5,.5,1,1,1,1 -> middle .5,1,1,1 = 0.875
    assert res["sphere"].iqm.value == pytest.approx(0.875)
    x, y = np.array(list(OWN[("sphere", "crl")].values())), np.array(list(OWN[("topk", "crl")].values()))
    assert res["sphere"].poi.value == pytest.approx(brute_poi(x, y))
    assert res["topk"].poi is None
    assert table_row(report[1], "CRL: robust aggregates", "sphere")[1].startswith("0.88 [")


def test_matches_rliable_when_installed() -> None:
    try:
        from rliable import library as rly
        from rliable import metrics
    except (ImportError, TypeError):  # optional; its arch dependency fails to import under pandas 3 (TypeError)
        pytest.skip("rliable not importable")
    rng = np.random.default_rng(3)
    a, b = rng.random((5, 10)), rng.random((5, 10))
    assert iqm(a) == pytest.approx(metrics.aggregate_iqm(a))
    assert probability_of_improvement(a, b) == pytest.approx(metrics.probability_of_improvement(a, b))
    _, cis = rly.get_interval_estimates({"a": a}, lambda s: np.array([metrics.aggregate_iqm(s)]), reps=4000)
    ours = iqm_ci(a, reps=4000)
    assert ours.low == pytest.approx(cis["a"][0, 0], abs=0.03) and ours.high == pytest.approx(cis["a"][1, 0], abs=0.03)


# --- Continual World metrics --------------------------------------------------------------------

def test_cl_metrics_known_values(runs_root: Path) -> None:
    m = cl_metrics(np.array([1.0, 0.5, 0.8]), np.array([0.2, 0.5, 0.8]))
    assert m.average_performance == pytest.approx(0.5)
    assert m.forgetting == pytest.approx(0.8 / 3)
    assert np.isnan(m.forward_transfer)
    # AUC: trapezoid over the segment, curve held flat to its ends; FT skips reference AUC == 1
    assert task_auc((150.0, 200.0), (0.2, 0.4), 100, 100) == pytest.approx((50 * 0.2 + 50 * 0.3) / 100)
    assert np.isnan(task_auc((50.0,), (1.0,), 100, 100))  # no eval inside the segment
    assert forward_transfer(np.array([0.5, 0.9, 0.3]), np.array([0.0, 1.0, 0.5])) == pytest.approx((0.5 + (-0.4)) / 2)
    # the report's metrics are the runs' own (one rule), with NaN for undefined
    own, final, auc, ref = np.array([1.0, 0.6]), np.array([0.4, 0.6]), np.array([0.5, np.nan]), np.array([0.5, 0.2])
    assert tuple(cl_metrics(own, final, auc, ref)) == pytest.approx((0.5, 0.3, 0.0))
    assert tuple(cl_metrics(own, final, auc, ref)) == pytest.approx(tuple(compute_cl_metrics(own, final, auc, ref)))
    unknown = cl_metrics(np.array([1.0, np.nan]), np.array([0.5, 0.5]), np.array([np.nan]), np.array([0.5]))
    assert unknown.average_performance == pytest.approx(0.5) and np.isnan(unknown.forgetting) and np.isnan(unknown.forward_transfer)
    ctx = contexts(load_runs([runs_root]))[0]
    run, ref = ctx.runs["crl"]["sphere"][1], ctx.runs["rl"]["sphere"][1]
    got = run_cl_metrics(run, (ref,))
    # own [1, 1, .5], final [.5, .5, .5]
    assert got.average_performance == pytest.approx(0.5)
    assert got.forgetting == pytest.approx((0.5 + 0.5 + 0) / 3)
    # evals (start+50, 0) and (start+100, own_i): area 50·own_i/2 over 100 steps, AUC_i = own_i/4
    # crl [.25, .25, .125]; reference (rl own [1, .5, 1]) [.25, .125, .25]
    want = np.mean([(0.25 - 0.25) / 0.75, (0.25 - 0.125) / 0.875, (0.125 - 0.25) / 0.75])
    assert got.forward_transfer == pytest.approx(want)


def test_forward_transfer_against_the_mean_reference(runs_root: Path) -> None:
    # AUC_i = own_i/4 in the fixture. sphere RL s0 own [1, 1, 1], s1 [1, .5, 1]: the mean reference
    # is [.25, .1875, .25]; sphere CRL s1 own [1, 1, .5] gives [.25, .25, .125].
    import dataclasses

    ctx = contexts(load_runs([runs_root]))[0]
    run, refs = ctx.runs["crl"]["sphere"][1], ctx.runs["rl"]["sphere"]
    want = np.mean([0.0, (0.25 - 0.1875) / 0.8125, (0.125 - 0.25) / 0.75])
    assert run_cl_metrics(run, refs, "mean").forward_transfer == pytest.approx(want)
    # the seed rule over the same runs picks s1 alone (the value test_cl_metrics_known_values checks)
    assert run_cl_metrics(run, refs, "seed").forward_transfer == pytest.approx(run_cl_metrics(run, (refs[1],)).forward_transfer)
    assert run_cl_metrics(run, refs, "seed").forward_transfer != pytest.approx(want)
    # a partial reference serves the tasks it evaluated: s0 finished only the first task, s1 only
    # the first two; the third task has no reference and leaves the mean
    s0 = dataclasses.replace(refs[0], eval_curves={t: c for t, c in refs[0].eval_curves.items() if t == TASKS[0]})
    s1 = dataclasses.replace(refs[1], eval_curves={t: c for t, c in refs[1].eval_curves.items() if t != TASKS[2]})
    partial = run_cl_metrics(run, (s0, s1), "mean").forward_transfer
    assert partial == pytest.approx(np.mean([0.0, (0.25 - 0.125) / 0.875]))
    assert reference_tasks(run, (s0, s1), "mean") == 2 and reference_tasks(run, refs, "mean") == 3
    # no RL run of the same seed: the seed rule finds no reference and uses the stored value
    other = dataclasses.replace(run, seed=7, stored_cl={"forward_transfer": 0.3})
    assert run_cl_metrics(other, refs, "seed").forward_transfer == pytest.approx(0.3)
    assert run_cl_metrics(other, refs, "mean").forward_transfer == pytest.approx(want)
    with pytest.raises(ValueError, match="valid choices: seed, mean"):
        run_cl_metrics(run, refs, "median")


def test_report_ft_reference_option(runs_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "o"
    assert main([str(runs_root), "--out", str(out), "--reps", "200", "--ft-reference", "mean"]) == 0
    md = (out / "report.md").read_text()
    assert "forward transfer against each task's AUC averaged over the method's RL runs" in md
    # sphere CRL s0 own [1, .5, 1] -> AUC [.25, .125, .25]; s1 as in the test above; reference [.25, .1875, .25]
    ft = [np.mean([0.0, (0.125 - 0.1875) / 0.8125, 0.0]), np.mean([0.0, (0.25 - 0.1875) / 0.8125, (0.125 - 0.25) / 0.75])]
    row = table_row(md, "Continual World metrics", "sphere (n=2)")
    assert row[2] == f"{np.mean(ft):.2f} ± {np.std(ft):.2f}" and row[3] == "3"
    with pytest.raises(SystemExit) as exc:
        main([str(runs_root), "--out", str(tmp_path / "p"), "--ft-reference", "median"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1 and "'median'" in err and "'seed', 'mean'" in err
    assert not (tmp_path / "p").exists()


def test_cl_table_in_report(report: tuple[Path, str]) -> None:
    # topk crl: s0 AP (0.5+0+0.5)/3=1/3, s1 (0.25+0+0.5)/3=0.25 -> 0.29 ± 0.04
    row = table_row(report[1], "Continual World metrics", "topk (n=2)")
    assert row[0] == "0.29 ± 0.04"


# --- TensorBoard curves and plots ---------------------------------------------------------------

def test_plasticity_section_compares_each_tasks_probes(report: tuple[Path, str]) -> None:
    _, md = report
    assert "### Plasticity against the baseline" in md
    # entk(): per task (two probes each, SPT = 100) Top-K seed 0 gives 17.5, 15.5, 13.5 and seed 1
    # two more each; SPHERE 19 and 21 flat. IQMs over the 6 values: 16.5 and 20 (difference 3.5).
    row = table_row(md, "plasticity diagnostics", "held-out r_e(K)")  # the first row: topk's
    assert row[:6] == ["topk", "2", "18.50 ± 1.00", "16.50 ± 1.00", "14.50 ± 1.00", "16.50"] and row[6:] == ["—", "—"]
    block = md[md.index("plasticity diagnostics"):]
    sphere = next(line for line in block.splitlines() if line.startswith("| held-out r_e(K) | sphere |"))
    assert "| 20.00 | 3.50 [" in sphere


def test_seed_band_on_common_grid() -> None:
    a = Curve(np.array([0.0, 10.0]), np.array([0.0, 10.0]))
    b = Curve(np.array([0.0, 5.0, 8.0]), np.array([2.0, 7.0, 10.0]))
    band = seed_band([a, b], n_points=5)
    assert band.grid == pytest.approx([0, 2, 4, 6, 8])  # cut to the shorter run
    want_b = np.interp(band.grid, b.steps, b.values)
    assert band.mean == pytest.approx((band.grid + want_b) / 2)
    assert band.std == pytest.approx(np.abs(band.grid - want_b) / 2)


def test_load_scalars_reads_event_files(runs_root: Path) -> None:
    folder = runs_root / "smoke" / "ppo-topk-crl-s1"
    curves = load_scalars(folder)
    assert set(curves) == {"plasticity/entk_rank", "plasticity/dormant_ratio"}
    c = curves["plasticity/entk_rank"]
    assert c.steps.tolist() == [0, 50, 100, 150, 200, 250, 300]
    assert c.values == pytest.approx([v for _, v in entk("topk", 1)])


def test_plots_exist_and_are_png(report: tuple[Path, str]) -> None:
    pytest.importorskip("matplotlib")
    out, md = report
    pngs = sorted(out.glob("*.png"))
    names = {p.name for p in pngs}
    assert {"plasticity-entk_rank_smoke_ppo_crl.png", "plasticity-dormant_ratio_smoke_ppo_crl.png", "success_smoke_ppo_crl.png",
            "success_smoke_ppo_rl.png", "eval_smoke_ppo_crl.png", "success-and-entk_rank_smoke_ppo_crl.png"} <= names
    assert "plasticity-entk_rank_smoke_ppo_rl.png" not in names  # RL runs have no event files here
    assert "success-and-entk_rank_smoke_ppo_rl.png" not in names  # no rank, no stacked figure
    for p in pngs:
        data = p.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5000
        assert f"]({p.name})" in md


# --- user errors --------------------------------------------------------------------------------

def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rl_moe.report", *args], capture_output=True, text=True, timeout=120, check=False)


def test_empty_folder_exit_2(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_cli(str(tmp_path), "--out", str(out))
    assert proc.returncode == 2
    assert "no results.json found" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_incompatible_and_bad_schema(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_run(tmp_path / "a", results("topk", "crl", 0, [1.0, 0.5, 0.0]))
    write_run(tmp_path / "a", results("sphere", "crl", 0, [1.0, 0.5]))  # a shorter task list
    assert main([str(tmp_path / "a"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "incompatible runs in suite 'smoke'" in err and "['reach', 'push']" in err
    write_run(tmp_path / "b", results("topk", "crl", 0, [1.0, 0.5, 0.0], schema=2))
    assert main([str(tmp_path / "b")]) == 2
    assert "unsupported schema 2" in capsys.readouterr().err
    bad = results("topk", "crl", 0, [1.0, 0.5, 0.0])
    del bad["own_success"]
    write_run(tmp_path / "c", bad)
    assert main([str(tmp_path / "c")]) == 2
    assert "missing key 'own_success'" in capsys.readouterr().err
    assert not (tmp_path / "b" / "report").exists()


BAD_RESULTS = [
    ("not an object", lambda d: [1, 2], "expected a JSON object"),
    ("wrong type", lambda d: {**d, "seed": "zero"}, "key 'seed' has type str"),
    ("bool as int", lambda d: {**d, "seed": True}, "key 'seed' has type bool"),
    ("unknown protocol", lambda d: {**d, "protocol": "joint"}, "unknown protocol 'joint'; valid choices"),
    ("unknown algo", lambda d: {**d, "algo": "sac"}, "unknown algo 'sac'; valid choices"),
    ("no tasks", lambda d: {**d, "tasks": []}, "empty task list"),
    ("too many rows", lambda d: {**d, "success_matrix": d["success_matrix"] * 2}, "success_matrix has 6 rows for 3 tasks"),
    ("long row", lambda d: {**d, "success_matrix": [[0.0] * 4]}, "success_matrix row 0: expected a list of at most 3"),
    ("ragged curve", lambda d: {**d, "eval_curves": {"reach": {"steps": [1, 2], "success": [0.0]}}}, "has 2 steps but 1 values"),
]


@pytest.mark.parametrize(("what", "break_it", "message"), BAD_RESULTS, ids=[b[0] for b in BAD_RESULTS])
def test_malformed_results_are_named_errors(tmp_path: Path, what: str, break_it, message: str) -> None:
    from rl_moe.report.runs import parse_results

    with pytest.raises(ReportError, match=re.escape(message)):
        parse_results(break_it(results("topk", "crl", 0, [1.0, 0.5, 0.0])), tmp_path / "results.json")


@pytest.mark.parametrize(("setup", "message"), [("missing", "no such run folder"), ("other file", "not a run folder or results.json"), ("garbage", "unreadable results")])
def test_unusable_report_paths(tmp_path: Path, setup: str, message: str) -> None:
    target = tmp_path / "x"
    if setup == "other file":
        target = tmp_path / "notes.txt"
        target.write_text("hi")
    elif setup == "garbage":
        target.mkdir()
        (target / "results.json").write_text("{truncated")
    with pytest.raises(ReportError, match=re.escape(message)):
        load_runs([target])


def test_unknown_method_names_choices(runs_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main([str(runs_root), "--method", "spheer", "--out", str(tmp_path / "o")]) == 2
    assert "unknown method 'spheer'; valid choices (methods found): sphere, topk" in capsys.readouterr().err
    with pytest.raises(ReportError):
        build_report([tmp_path / "missing"], tmp_path / "o", ReportOptions())


def test_duplicate_seed_keeps_complete_run(tmp_path: Path) -> None:
    write_run(tmp_path / "x", results("topk", "crl", 0, [1.0, 1.0, 1.0]))
    partial = results(
        "topk", "crl", 0, [0.0], tasks=TASKS, complete=False, finished_tasks=1,
        final_success=[None] * 3, success_matrix=[[0.0, None, None]],
    )
    write_run(tmp_path / "y", partial)
    runset = load_runs([tmp_path])
    (kept,) = runset.runs
    assert kept.complete and kept.own == (1.0, 1.0, 1.0)
    assert len(runset.dropped) == 1 and "duplicated" in runset.dropped[0][1]


def test_without_matplotlib_tables_still_written(runs_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rl_moe.report.plots", None)  # makes the plotting import fail
    files = build_report([runs_root], tmp_path / "o", ReportOptions(reps=200))
    md = files.markdown.read_text()
    assert files.figures == () and not list((tmp_path / "o").glob("*.png"))
    assert "Figures skipped: matplotlib is not installed" in md and "| reach | 0.75 ± 0.25 |" in md


def test_auc_uses_the_segments_a_run_really_trained(runs_root: Path) -> None:
    # PPO rounds a 100-step budget up to 200-step rollouts: the recorded segments win.
    import dataclasses

    ctx = contexts(load_runs([runs_root]))[0]
    run, ref = ctx.runs["crl"]["sphere"][1], ctx.runs["rl"]["sphere"][1]
    n = len(run.tasks)
    seg = tuple((200 * i, 200 * (i + 1)) for i in range(n))
    curves = {t: ((200.0 * i + 100, 200.0 * i + 200), (0.0, 1.0)) for i, t in enumerate(run.tasks)}
    run = dataclasses.replace(run, segments=seg, eval_curves=curves)
    ref = dataclasses.replace(ref, segments=seg, eval_curves={t: ((200.0 * i + 150, 200.0 * i + 200), (0.0, 0.5)) for i, t in enumerate(run.tasks)})
    assert run.segment_length(0) == 200 and run.steps_per_task != 200
    # run: 0 until step 100 of 200, then a ramp to 1 over the last 100: AUC = 50/200 = 0.25
    # reference: 0 until 150, ramp to 0.5 by 200: AUC = 12.5/200 = 0.0625
    got = run_cl_metrics(run, (ref,))
    assert got.forward_transfer == pytest.approx((0.25 - 0.0625) / (1 - 0.0625))


def test_success_axes_are_clamped_and_condition_numbers_log_scaled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runs_root: Path) -> None:
    from rl_moe.report import plots

    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig) or path)
    assert plots.axis_for("eval/success") == {"ylim": (0.0, 1.0)} and plots.axis_for("plasticity/feature_cond") == {"log": True}
    steps = np.array([0.0, 100.0, 200.0])
    cond = {"topk": [Curve(steps, np.array([1e2, 1e6, 1e10])), Curve(steps, np.array([1e3, 1e7, 1e9]))]}
    plots.plot_bands(cond, "t", "kappa", tmp_path / "k.png", [], **plots.axis_for("plasticity/feature_cond"))
    ax = figures[-1].axes[0]
    assert ax.get_yscale() == "log"
    # The line is the geometric mean of the seeds, 10**mean(log10): 10**6.5 at step 100.
    x, y = ax.lines[0].get_xdata(), ax.lines[0].get_ydata()
    assert np.interp(100.0, x, np.log10(y)) == pytest.approx(6.5, abs=0.05)
    assert y[-1] == pytest.approx(10**9.5)
    success = {"topk": [Curve(steps, np.array([0.0, 1.0, 1.0])), Curve(steps, np.array([0.0, 0.0, 1.0]))]}
    plots.plot_bands(success, "t", "success", tmp_path / "s.png", [], **plots.axis_for("eval/success"))
    assert figures[-1].axes[0].get_ylim() == (0.0, 1.0)
    ctx = contexts(load_runs([runs_root]))[0]
    plots.plot_success(ctx, "crl", ["topk", "sphere"], tmp_path / "bars.png")
    assert figures[-1].axes[0].get_ylim() == (0.0, 1.0)


def test_eval_curve_drops_at_a_task_boundary_instead_of_jumping_back(runs_root: Path) -> None:
    import dataclasses

    from rl_moe.report.plots import eval_curve

    run = contexts(load_runs([runs_root]))[0].runs["crl"]["sphere"][0]
    a, b = run.tasks[:2]
    run = dataclasses.replace(run, eval_curves={a: ((0.0, 100.0, 200.0), (0.0, 0.5, 0.9)), b: ((200.0, 300.0), (0.1, 0.4))})
    curve = eval_curve(run)
    assert curve.steps.tolist() == [0.0, 100.0, 200.0, 200.0, 300.0]
    assert curve.values.tolist() == [0.0, 0.5, 0.9, 0.1, 0.4]  # task a's 0.9, then task b starts at 0.1


# written as results.json held them before the position rule was renamed: read under today's name
PAPER_RULES = {"episode_length": 500, "task_fields": {"positions": "fixed"}, "grad_clip": "separate", "eval_positions": "both"}


def test_run_folders_are_found_once_and_named_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rl_moe.report.loading import find_results

    a = write_run(tmp_path / "runs", results("topk", "crl", 0, [1.0, 0.0, 0.0]))
    b = write_run(tmp_path / "runs", results("topk", "crl", 1, [1.0, 0.0, 0.0]))
    monkeypatch.chdir(tmp_path)
    # the folder twice (relative, then absolute) and a results file inside it: each run once,
    # under the relative name it was first given, so a committed report's notes name no machine
    found = find_results([Path("runs"), tmp_path / "runs", a / "results.json"])
    assert found == [(p / "results.json").relative_to(tmp_path) for p in (a, b)]
    assert not any(f.is_absolute() for f in found)


def test_runs_of_one_table_must_share_their_protocol(tmp_path: Path) -> None:
    # Same suite, method and seed, two clipping rules (a --set beside the suite's own): two
    # tables, each naming the rule that sets it apart, and neither seed dropped as a duplicate.
    write_run(tmp_path / "a", results("topk", "rl", 0, [1.0, 1.0, 1.0], rules=PAPER_RULES))
    write_run(tmp_path / "a" / "joint", results("topk", "rl", 0, [0.0, 0.0, 0.0], rules={**PAPER_RULES, "grad_clip": "joint"}))
    write_run(tmp_path / "a" / "old", results("topk", "rl", 1, [0.0, 1.0, 0.0]))  # written before rules were recorded
    runset = load_runs([tmp_path / "a"])
    assert not runset.dropped
    own = {key.suite: [r.own for r in runs] for key, runs in runset.groups.items()}
    assert own == {
        "smoke [separate gradient clipping]": [(1.0, 1.0, 1.0)],
        "smoke [joint gradient clipping]": [(0.0, 0.0, 0.0)],
        "smoke [rules not recorded]": [(0.0, 1.0, 0.0)],
    }
    assert main([str(tmp_path / "a"), "--out", str(tmp_path / "o")]) == 0
    md = (tmp_path / "o" / "report.md").read_text()
    assert md.count("Protocol: 500-step episodes, position_rule fixed, ") == 2 and "Protocol: rules not recorded" in md
    assert md.index("## smoke [joint gradient clipping] / ppo") < md.index("joint gradient clipping, evaluated on both")
    write_run(tmp_path / "b", results("topk", "rl", 0, [1.0, 0.5, 0.0], rules=PAPER_RULES))
    write_run(tmp_path / "b", results("sphere", "rl", 0, [1.0, 0.5, 0.0], rules=PAPER_RULES))
    assert main([str(tmp_path / "b"), "--out", str(tmp_path / "o2")]) == 0
    md = (tmp_path / "o2" / "report.md").read_text()
    assert "Protocol: 500-step episodes, position_rule fixed, separate gradient clipping, evaluated on both positions." in md


def test_rerun_removes_only_its_own_stale_figures(tmp_path: Path) -> None:
    # A second run of a different rule splits the group, so every figure gets a new name: the old
    # report's figures go, a file the report never drew stays.
    pytest.importorskip("matplotlib")
    write_run(tmp_path / "a", results("topk", "rl", 0, [1.0, 1.0, 1.0], rules=PAPER_RULES))
    out = tmp_path / "o"
    assert main([str(tmp_path / "a"), "--out", str(out)]) == 0
    first = {p.name for p in out.glob("*.png")}
    assert "success_smoke_ppo_rl.png" in first
    (out / "notes.png").write_bytes(PNG_MAGIC)
    write_run(tmp_path / "a" / "joint", results("topk", "rl", 0, [0.0, 0.0, 0.0], rules={**PAPER_RULES, "grad_clip": "joint"}))
    assert main([str(tmp_path / "a"), "--out", str(out)]) == 0
    second = {p.name for p in out.glob("*.png")}
    md = (out / "report.md").read_text()
    assert not first & second and "notes.png" in second
    assert second - {"notes.png"} == {name for name in second if f"]({name})" in md}
    assert any("joint-gradient-clipping" in name for name in second)


def test_iqm_difference_and_the_chance_to_separate_have_known_answers() -> None:
    from rl_moe.report.stats import iqm_difference_ci, power_to_separate

    ones, zeros = np.ones((3, 3)), np.zeros((3, 3))
    assert tuple(iqm_difference_ci(ones, zeros, reps=500)) == (1.0, 1.0, 1.0)
    assert power_to_separate(ones, zeros, 3, sims=50, reps=200) == 1.0
    # the same population on both sides: the CI excludes 0 less often than with a real difference
    # (a percentile bootstrap over few discrete runs does so more often than the nominal 5%: 0.1-0.2)
    pop = np.array([[0.0, 0.2, 1.0], [0.2, 0.0, 0.4], [1.0, 0.4, 1.0], [0.0, 0.0, 0.0]])
    assert power_to_separate(pop, pop, 5, sims=200, reps=400) < 0.3
    assert power_to_separate(np.ones((4, 3)), np.ones((4, 3)), 5, sims=50, reps=100) == 0.0
    # a real difference: more runs, more often separated
    better = np.clip(pop + 0.3, 0, 1)
    assert power_to_separate(better, pop, 20, sims=200, reps=400) > power_to_separate(better, pop, 3, sims=200, reps=400)
    # unequal counts: more baseline runs narrow the baseline's side, so the CI excludes 0 more often;
    # a method with one distinct run against a constant baseline is separated at any count
    assert power_to_separate(better, pop, 3, sims=200, reps=400, n_baseline=30) > power_to_separate(better, pop, 3, sims=200, reps=400, n_baseline=2)
    assert power_to_separate(ones, zeros, 2, sims=50, reps=200, n_baseline=7) == 1.0
    # a decision rule's "gain of at least d, separated": the gain's size and its sign count
    assert power_to_separate(ones, zeros, 3, sims=50, reps=200, min_difference=0.2) == 1.0
    assert power_to_separate(ones, zeros, 3, sims=50, reps=200, min_difference=1.5) == 0.0
    assert power_to_separate(zeros, ones, 3, sims=50, reps=200) == 1.0
    assert power_to_separate(zeros, ones, 3, sims=50, reps=200, min_difference=0.0) == 0.0  # a loss
    small = np.full((3, 3), 0.3), np.full((3, 3), 0.2)
    assert power_to_separate(*small, 5, sims=50, reps=200, min_difference=0.2) == 0.0
    assert power_to_separate(*small, 5, sims=50, reps=200, min_difference=0.1) == 1.0  # 0.1 exactly, in floats


def test_whole_run_resampling_keeps_each_runs_tasks_together() -> None:
    from rl_moe.report.stats import iqm_difference_ci, run_resample, stratified_resample

    rng = np.random.default_rng(0)
    scores = np.arange(12.0).reshape(4, 3)  # every row distinct
    rows = {tuple(r) for r in scores}
    assert run_resample(scores, 200, rng).shape == (200, 4, 3)
    assert all(tuple(r) in rows for r in run_resample(scores, 200, rng).reshape(-1, 3))
    # per task, rows are mixed: some replica row is no original row
    assert any(tuple(r) not in rows for r in stratified_resample(scores, 200, rng).reshape(-1, 3))
    # known answer: two runs over 20 tasks, one learning every task and one none, against a baseline
    # of zeros. A whole-run replica holds both runs (IQM 0.5, probability 1/2), twice the learner
    # (1, 1/4) or twice the other (0, 1/4), so the 95% CI is [0, 1]. Per task, the 40 cells hold
    # Binomial(40, 1/2) ones and the IQM is (ones - 10) / 20 clipped to [0, 1]: a CI of about
    # [0.2, 0.8], far inside.
    x, y = np.vstack([np.ones(20), np.zeros(20)]), np.zeros((3, 20))
    assert tuple(iqm_difference_ci(x, y, reps=2000, resample="run")) == (0.5, 0.0, 1.0)
    per_task = iqm_difference_ci(x, y, reps=2000)
    assert per_task.value == 0.5 and 0.05 < per_task.low < 0.5 < per_task.high < 0.95


def test_the_report_says_how_far_the_methods_are_from_separating(
    report: tuple[Path, str], runs_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rl_moe.report import separation
    from rl_moe.report.separation import separation_table
    from rl_moe.report.stats import VERDICT_REPS, fmt, iqm_difference_ci
    from rl_moe.report.tables import complete_scores

    _, md = report
    caption = "chance that its per-task 95% CI excludes 0"
    assert caption in md
    row = table_row(md, caption, "sphere")
    assert row[0] == "2 / 2" and row[3] in ("yes†", "not separated yet") and 0.0 <= float(row[4]) <= 1.0
    # whatever --reps says (here 100), the CIs the verdict reads come from VERDICT_REPS replicas
    ctx = contexts(load_runs([runs_root]))[0]
    seen: list[tuple[int, str]] = []

    def spy(x: np.ndarray, y: np.ndarray, reps: int = 10_000, resample: str = "task", **kw: object) -> object:
        seen.append((reps, resample))
        return iqm_difference_ci(x, y, reps=reps, resample=resample, **kw)

    monkeypatch.setattr(separation, "iqm_difference_ci", spy)
    table = separation_table(ctx, "rl", "topk", "sphere", reps=100)
    assert table is not None and seen == [(VERDICT_REPS, "task"), (VERDICT_REPS, "run")]
    assert f"both from at least {VERDICT_REPS:,} replicas" in md and "one standard error is at most 0.025 (400 studies) and 0.035 (200)" in md
    cells = dict((r[0], r[1:]) for r in table.rows)["sphere"]
    s, base = complete_scores(ctx.runs["rl"]["sphere"], "own"), complete_scores(ctx.runs["rl"]["topk"], "own")
    for cell, resample in ((cells[1], "task"), (cells[2], "run")):
        d = iqm_difference_ci(s, base, reps=VERDICT_REPS, resample=resample)
        assert cell.endswith(f"[{fmt(d.low)}, {fmt(d.high)}]"), (cell, d)
    # runs, difference, its whole-run CI, verdict, permutation p, 4 chances, the false-separation rate, the test's power
    assert len(row) == 11
    low, high = (float(v) for v in row[2].strip("[]").split(", "))
    assert -1.0 <= low <= float(row[1].split(" [")[0]) <= high <= 1.0
    # 2 runs a side: every chance is marked as resting on too few runs, and the caption says so
    chances = [*row[5:-1], *row[-1].split(" / ")]
    assert len(chances) == 8 and all(v.endswith("†") and 0.0 <= float(v[:-1]) <= 1.0 for v in chances)
    assert "† fewer than 5 runs on a side" in md


def test_the_verdicts_ci_does_not_hang_on_the_bootstrap_draw() -> None:
    """LN against Top-K on the slice (own-segment success of the committed runs, 5 seeds each): the
    difference's replicas pile up at exactly 0 (1.3%) with 1.7% below it, so the 2.5th percentile is
    0 once converged. 2,000 replicas drawn from seed 0 put it at 0.02 and the report said "yes"."""
    from rl_moe.report.stats import VERDICT_REPS, iqm_difference_ci, monte_carlo_se
    from rl_moe.report.separation import verdict_cell

    ln = np.array([[1, 0, 1], [1, 0, 1], [1, 1, 1], [1, 0, 1], [1, 0, 1]], dtype=float)
    topk = np.array([[1, 0, 0], [0, 0, 0.4], [1, 0, 1], [1, 1, 1], [1, 0, 0]])
    assert iqm_difference_ci(ln, topk, reps=2000).low == pytest.approx(0.02222, abs=1e-4)
    lows = {iqm_difference_ci(ln, topk, reps=VERDICT_REPS, seed=seed).low for seed in range(4)}
    assert lows == {0.0}
    d = iqm_difference_ci(ln, topk, reps=VERDICT_REPS)
    assert d.value == pytest.approx(0.4) and verdict_cell(d.low, d.high, 5, 5) == "not separated yet"
    assert monte_carlo_se(200) == pytest.approx(0.0354, abs=1e-4) and monte_carlo_se(400) == 0.025


def test_a_ci_that_excludes_0_on_few_runs_is_marked_as_no_verdict() -> None:
    from rl_moe.report.separation import verdict_cell

    assert verdict_cell(0.02, 0.84, 3, 5) == "yes†" and verdict_cell(-0.84, -0.02, 5, 4) == "yes†"
    assert verdict_cell(0.02, 0.84, 5, 5) == "yes" and verdict_cell(-0.5, -0.1, 10, 6) == "yes"
    assert verdict_cell(-0.01, 0.84, 3, 5) == verdict_cell(-0.3, 0.4, 10, 10) == "not separated yet"
    assert verdict_cell(0.0, 0.5, 10, 10) == "not separated yet"  # an end at 0 does not exclude it
    assert verdict_cell(1e-12, 0.5, 10, 10) == verdict_cell(-0.5, -1e-12, 10, 10) == "not separated yet"  # nor a float hair off it


def test_power_cells_are_marked_below_five_runs_a_side() -> None:
    from rl_moe.report.separation import power_cell

    assert power_cell(0.1234, 5, 5) == "0.12"
    assert power_cell(0.5, 4, 10) == "0.50†" and power_cell(0.5, 10, 2) == "0.50†"


def _brute_force_permutation_p(x: np.ndarray, y: np.ndarray) -> float:
    """Every split by a loop, the IQM by scipy (independent of the report's own ``iqm``)."""
    from scipy.stats import trim_mean

    def iqm(runs: np.ndarray) -> float:
        return float(trim_mean(runs.ravel(), 0.25))

    pooled, m = np.concatenate([x, y]), len(x)
    observed, hits, splits = abs(iqm(x) - iqm(y)), 0, 0
    for group in itertools.combinations(range(len(pooled)), m):
        rest = [i for i in range(len(pooled)) if i not in group]
        hits += abs(iqm(pooled[list(group)]) - iqm(pooled[rest])) >= observed - 1e-12
        splits += 1
    return hits / splits


def test_the_permutation_p_value_has_known_answers_and_holds_its_level() -> None:
    from rl_moe.report.stats import permutation_p, permutation_power

    # 3 runs of ones against 3 of zeros: of the C(6, 3) = 20 splits only the observed one and its
    # mirror reach |difference| 1
    assert permutation_p(np.ones((3, 2)), np.zeros((3, 2))) == pytest.approx(2 / 20)
    assert permutation_p(np.ones((4, 3)), np.ones((4, 3))) == 1.0  # nothing to tell apart
    rng = np.random.default_rng(3)
    levels = np.array([0.0, 0.2, 0.4, 1.0])
    for m, n in ((4, 3), (5, 5), (2, 6)):
        x, y = rng.choice(levels, size=(m, 3)), rng.choice(levels, size=(n, 3))
        exact = _brute_force_permutation_p(x, y)
        assert permutation_p(x, y) == pytest.approx(exact)
        # random splits when there are too many to list: close to the exact value
        assert abs(permutation_p(x, y, max_splits=4000, seed=1) - exact) < 0.04
    # 10 runs far above 10 others: exactly 2 of the C(20, 10) splits are as extreme, and 50 random
    # splits plus the observed one give a p of at least 1/51 (the observed split counts), never 0
    high, low = 1.0 + rng.random((10, 3)) * 0.1, rng.random((10, 3)) * 0.1
    assert permutation_p(high, low, max_splits=200_000) == pytest.approx(2 / math.comb(20, 10))
    assert 1 / 51 <= permutation_p(high, low, max_splits=50, seed=2) <= 3 / 51
    # level: two methods whose runs come from one distribution (tasks of a run correlated through a
    # per-run skill) are "separated" at p <= a in at most a fraction a of studies, at every a;
    # 1000 studies of 5 against 5 runs, binomial sd <= 0.013
    def runs(k: int) -> np.ndarray:
        skill = rng.random((k, 1))
        return levels[np.clip((skill * 4 + rng.normal(0, 0.7, (k, 3))).astype(int), 0, 3)]

    ps = np.array([permutation_p(runs(5), runs(5)) for _ in range(1000)])
    for a in (0.05, 0.1, 0.2, 0.5):
        assert np.mean(ps <= a) <= a + 0.03, (a, np.mean(ps <= a))
    # and it does separate a real difference once there are enough runs; its power grows with them
    assert permutation_p(0.5 + 0.5 * runs(8), 0.5 * runs(8)) < 0.01
    better, worse = 0.3 + 0.7 * runs(6), 0.7 * runs(6)
    assert permutation_power(better, worse, 3) == 0.0  # 3 against 3: p >= 0.10 in every study
    assert permutation_power(better, worse, 10) > permutation_power(better, worse, 5) > 0.0
    same = runs(8)
    assert permutation_power(same, same, 5, sims=400) <= 0.05 + 0.035  # one population: the level
    for bad in ((np.ones((3, 2)), np.ones((0, 2))), (np.ones((3, 2)), np.ones((3, 3))), (np.full((2, 2), np.nan), np.ones((2, 2)))):
        with pytest.raises(ValueError):
            permutation_p(*bad)


def test_a_set_variant_of_a_method_is_its_own_group() -> None:
    """The screen's runs are all ``--method sphere`` or ``sphere_guard``; those with ``--set
    reg.sphere.*`` are other methods and must not fill the same seed slots (before, rho0.001-s0
    and lossratio-s0 were one method's seed 0 and one of them was dropped)."""
    from rl_moe.continual.resolve import RunRequest, moved_settings, resolve

    screen = Path(__file__).resolve().parents[1] / "results" / "sphere-screen"
    groups = {k.method: tuple(r.seed for r in v) for k, v in load_runs([screen]).groups.items()}
    assert groups["sphere [sphere.coef_mode=loss_ratio, sphere.rho=0.05]"] == (0, 1)
    assert groups["sphere [sphere.rho=0.001]"][0] == 0
    assert "sphere" not in groups and groups["sphere_guard"] == (0, 1)
    plain = resolve(RunRequest(suite="smoke", method="sphere", tasks=1))
    assert moved_settings(plain) == {}
    moved = resolve(RunRequest(suite="smoke", method="sphere", tasks=1, overrides=("reg.sphere.rho=0.001", "reg.sphere.eps=1e-8")))
    assert moved_settings(moved) == {"sphere.rho": 0.001}  # eps=1e-8 is the method's own value


# --- held-out positions (python -m rl_moe.positions) -----------------------------------------------

def write_positions(folder: Path, n: int, train: list[float], heldout: list[float], tasks: list[str] | None = None) -> None:
    """A ``positions-<n>.json`` as ``python -m rl_moe.positions`` writes it."""
    tasks = tasks or TASKS[: len(train)]
    data = {"tasks": tasks, "heldout_positions": n, "train_positions": 5, "episodes_per_position": 1,
            "own_success_train": train, "own_success_heldout": heldout, "last_checkpoint_heldout": heldout}  # fmt: skip
    (folder / f"positions-{n}.json").write_text(json.dumps(data))


@pytest.fixture(scope="module")
def heldout_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("heldout")
    own = {("topk", 0): [1.0, 0.0, 0.5], ("topk", 1): [0.5, 0.0, 0.5], ("topk", 2): [1.0, 1.0, 1.0], ("sphere", 0): [1.0, 0.5, 1.0], ("sphere", 1): [1.0, 1.0, 0.5]}
    folders = {k: write_run(root, results(k[0], "crl", k[1], v)) for k, v in own.items()}
    write_positions(folders["topk", 0], 20, own["topk", 0], [0.9, 0.1, 0.4])
    write_positions(folders["topk", 0], 25, own["topk", 0], [0.8, 0.0, 0.6])  # the largest N is the one read
    write_positions(folders["topk", 1], 25, own["topk", 1], [0.4, 0.2, 0.6])
    # topk seed 2 has no scores; sphere seed 1's were taken from another state of the run
    write_positions(folders["sphere", 0], 25, own["sphere", 0], [1.0, 0.4, 0.8])
    write_positions(folders["sphere", 1], 25, [0.0, 1.0, 0.5], [0.2, 0.2, 0.2])
    out = tmp_path_factory.mktemp("heldout-report")
    assert main([str(root), "--out", str(out), "--reps", "500"]) == 0
    return out, (out / "report.md").read_text()


def test_heldout_table_counts_only_the_scored_seeds(heldout_report: tuple[Path, str]) -> None:
    _, md = heldout_report
    caption = "smoke / ppo / CRL: own-task success of each task's checkpoint on held-out positions"
    header = next(line for line in md[md.index(caption):].splitlines() if line.startswith("| task"))
    assert header == "| task | topk (n=2) | sphere (n=1) |"
    assert "25 held-out positions per task" in md[md.index(caption):].splitlines()[0]
    assert table_row(md, caption, "reach") == ["0.60 ± 0.20", "1.00"]
    assert table_row(md, caption, "push") == ["0.10 ± 0.10", "0.40"]
    # per-seed averages 7/15 and 6/15
    assert table_row(md, caption, "average") == ["0.43 ± 0.03", "0.73"]
    # the own-segment table still counts all seeds
    assert table_row(md, "CRL: success right after", "average")[:2] == ["0.61 ± 0.28", "0.83 ± 0.00"]  # seeds 1/2, 1/3, 1


def test_heldout_robust_aggregates_known_values(heldout_report: tuple[Path, str]) -> None:
    _, md = heldout_report
    caption = "robust aggregates of held-out own-task success"
    # 6 topk scores {0.8, 0, 0.6, 0.4, 0.2, 0.6}: IQM drops one per end -> mean(0.2, 0.4, 0.6, 0.6) = 0.45
    n, iqm_cell, mean_cell, poi = table_row(md, caption, "topk")
    assert n == "2" and iqm_cell.startswith("0.45 [") and mean_cell.startswith("0.43 [") and poi == "—"
    # sphere s0 against both topk seeds, per task: reach 1.0 > 0.8, 0.4 -> 1; push 0.4 > 0, 0.2 -> 1;
    # faucet 0.8 > 0.6, 0.6 -> 1: P = 1
    assert table_row(md, caption, "sphere")[3].startswith("1.00 [")


def test_stale_heldout_scores_are_left_out_and_named(heldout_report: tuple[Path, str]) -> None:
    _, md = heldout_report
    notes = md[md.index("## Notes"):]
    assert "ppo-sphere-crl-s1/positions-25.json: left out, its training-position success [0.0, 1.0, 0.5] differs from results.json's [1.0, 1.0, 0.5]" in notes
    assert "topk-crl-s2" not in notes  # no file is no note
    assert "robust aggregates of held-out own-task success (25 held-out positions per task" in md


def test_without_positions_files_the_report_has_no_heldout_tables(report: tuple[Path, str]) -> None:
    _, md = report
    assert "held-out positions" not in md and "held-out own-task" not in md and "## Notes" not in md


def test_heldout_scores_of_other_tasks_or_fewer_tasks_are_named(tmp_path: Path) -> None:
    other = write_run(tmp_path, results("topk", "crl", 0, [1.0, 0.5, 0.0]))
    write_positions(other, 25, [1.0, 0.5], [0.8, 0.4], tasks=["push", "reach"])
    fewer = write_run(tmp_path, results("topk", "crl", 1, [1.0, 0.5, 0.0]))
    write_positions(fewer, 25, [1.0, 0.5], [0.8, 0.4])  # scored after two tasks, the run went on
    (fewer / "positions-x.json").write_text("{}")  # not a positions file: ignored
    (fewer / "positions-\u00b2.json").write_text("{}")
    by_seed = {r.seed: r for r in load_runs([tmp_path]).runs}
    assert by_seed[0].heldout == () and by_seed[0].heldout_positions == 0 and "its tasks ['push', 'reach'] are not the run's first 2" in by_seed[0].heldout_note
    assert by_seed[1].heldout[:2] == (0.8, 0.4) and np.isnan(by_seed[1].heldout[2]) and by_seed[1].heldout_positions == 25
    assert "covers 2 of the run's 3 finished tasks" in by_seed[1].heldout_note


def test_a_renamed_positions_file_is_a_named_error(tmp_path: Path) -> None:
    folder = write_run(tmp_path, results("topk", "crl", 0, [1.0, 0.5, 0.0]))
    write_positions(folder, 20, [1.0, 0.5, 0.0], [0.8, 0.4, 0.0])
    (folder / "positions-20.json").rename(folder / "positions-30.json")
    with pytest.raises(ReportError, match=re.escape("positions-30.json: holds heldout_positions 20, but its name says 30")):
        load_runs([tmp_path])


def test_unreadable_heldout_scores_are_a_named_error(tmp_path: Path) -> None:
    folder = write_run(tmp_path, results("topk", "crl", 0, [1.0, 0.5, 0.0]))
    (folder / "positions-25.json").write_text('{"tasks": ["reach"]}')
    proc = run_cli(str(tmp_path), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "positions-25.json: unreadable held-out scores (KeyError" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_task_switch_lines_carry_the_name_of_the_task_they_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    from rl_moe.report import plots

    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig) or path)
    curve = [Curve(np.array([0.0, 100.0, 200.0, 300.0]), np.array([0.1, 0.5, 0.2, 0.9]))]
    bounds = [(100.0, "push-wall-v3"), (200.0, "faucet-close-v3")]
    plots.plot_bands({"topk": curve}, "t", "success", tmp_path / "a.png", bounds)
    plots.plot_stacked([({"topk": curve}, "success", {}), ({"topk": curve}, "rank", {})], "t", tmp_path / "b.png", bounds)
    bands, stacked = figures
    labels = lambda ax: [t.get_text().strip() for t in ax.texts]  # noqa: E731
    assert labels(bands.axes[0]) == ["push-wall-v3", "faucet-close-v3"]
    assert [labels(ax) for ax in stacked.axes] == [["push-wall-v3", "faucet-close-v3"], []]  # named once, on the top panel
    assert [line.get_xdata()[0] for line in bands.axes[0].lines if line.get_linestyle() == "--"] == [100.0, 200.0]
