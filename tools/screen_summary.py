"""Test 2 of the SPHERE screen (docs/results.md §6), per run: own-task success, the share of
updates that are *collapsed*, the held-out r_e(K) at the end, and how often the online features
are exactly zero. Reads only results.json and the TensorBoard events, so it works on the committed
summaries.

    python -m tools.screen_summary results/sphere-screen [--json results/sphere-screen/summary.json]

*Collapsed* (docs/results.md, "Definitions"): SPHERE's λ > 1e4 or its penalty < 1e-8, per update
(:func:`rl_moe.regularizers.sphere.is_collapsed`); runs from 2026-11-26 also log it as
``train/sphere_collapsed``, kept in the JSON beside the share recomputed from the logged λ and
penalty. A variant passes test 2 on a run when the success is ≥ 0.9 and fewer than half of the
updates are collapsed.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from rl_moe.positions import DEFAULT_HELDOUT
from rl_moe.regularizers.sphere import COLLAPSE_COEF, is_collapsed
from rl_moe.report.scalars import load_scalars
from rl_moe.rundir import RunDir

PASS_SUCCESS, PASS_COLLAPSED = 0.9, 0.5
#: The held-out positions ``python -m rl_moe.positions`` scores the docs' tables by (its default);
#: the run's own ``success_heldout`` is its periodic evaluation's 5 positions.
HELDOUT_POSITIONS = DEFAULT_HELDOUT
#: The summary's key for that score, named by its position count (``success_heldout_25``).
HELDOUT_KEY = f"success_heldout_{HELDOUT_POSITIONS}"


def _scalars(run: Path) -> dict[str, dict[float, float]]:
    """step -> value per tag, over all of the run's event files (the report's reader)."""
    return {tag: dict(zip(c.steps.tolist(), c.values.tolist())) for tag, c in load_scalars(run, ("train/", "plasticity/", "eval/")).items()}


def summarize(run: Path) -> dict[str, object]:
    res = json.loads((run / "results.json").read_text())
    cfg = json.loads((run / "config.json").read_text())
    s = _scalars(run)
    lam, loss = s.get("train/coef_sphere", {}), s.get("train/loss_sphere", {})
    steps = sorted(set(lam) & set(loss))
    collapsed = [is_collapsed(lam[t], loss[t]) for t in steps]
    rank = s.get("plasticity/entk_rank", {})
    online = s.get("plasticity/feature_norm_online", {})
    share = sum(collapsed) / len(collapsed) if collapsed else None
    success = res["own_success"][0] if res.get("complete") else None
    ratio = s.get("train/sphere_trace_ratio", {})
    # Exactly-zero units of the last hidden layer on the online probe (tau = 0), at the last probe.
    zero_tags = sorted((t for t in s if t.startswith("plasticity/dormant_ratio_tau0_l") and t.endswith("_online")), key=lambda t: int(t.split("_l")[-1].split("_")[0]))
    zeros = s[zero_tags[-1]] if zero_tags else {}
    evals = s.get("eval/success", {})
    positions = RunDir(run).positions(HELDOUT_POSITIONS)
    heldout = json.loads(positions.read_text())["own_success_heldout"][0] if positions.exists() else None
    return {
        "run": run.name,
        "method": res["method"],
        "regularizers": cfg.get("regularizers", {}).get("sphere"),
        "seed": res["seed"],
        "complete": res.get("complete", False),
        "steps": res.get("global_step"),
        "success": success,
        "success_heldout": (res.get("eval_curves", {}).get(res["tasks"][0], {}).get("success_heldout") or [None])[-1],
        HELDOUT_KEY: heldout,
        "updates": len(steps),
        "collapsed_share": share,
        "logged_collapsed_share": (lambda v: sum(v) / len(v) if v else None)(list(s.get("train/sphere_collapsed", {}).values())),
        "lambda_gt_1e4_share": sum(lam[t] > COLLAPSE_COEF for t in steps) / len(steps) if steps else None,
        "loss_zero_share": sum(loss[t] == 0 for t in steps) / len(steps) if steps else None,
        "entk_rank_end": rank[max(rank)] if rank else None,
        "feature_norm_online_zero": f"{sum(v == 0 for v in online.values())} of {len(online)}",
        "lambda_max": max(lam[t] for t in steps) if steps else None,
        "loss_min": min(loss[t] for t in steps) if steps else None,
        "trace_ratio_median": statistics.median(ratio.values()) if ratio else None,
        "last_hidden_zero_share_end": zeros[max(zeros)] if zeros else None,
        "eval_success_latest": evals[max(evals)] if evals else None,
        "eval_step_latest": int(max(evals)) if evals else None,
        "passes": None if success is None or share is None else bool(success >= PASS_SUCCESS and share < PASS_COLLAPSED),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root", type=Path)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    rows = [summarize(r.parent) for r in sorted(args.root.rglob("results.json"))]
    print(f"| run | success (train / held out, 5 / {HELDOUT_POSITIONS} positions) | latest evaluation (step) | updates collapsed | λ > 1e4 | penalty exactly 0 | λ max | penalty min | tr(G) ratio, median | last-hidden units at 0, last probe | r_e(K) held out, end | online features 0 | passes |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        pct = lambda v: "—" if v is None else f"{100 * v:.0f}%"  # noqa: E731
        h25 = "—" if r[HELDOUT_KEY] is None else f"{r[HELDOUT_KEY]:.2f}"
        succ = "unfinished" if r["success"] is None else f"{r['success']:.2f} / {r['success_heldout']:.2f} / {h25}"
        rank = "—" if r["entk_rank_end"] is None else f"{r['entk_rank_end']:.2f}"
        num = lambda v: "—" if v is None else f"{v:.3g}"  # noqa: E731
        latest = "—" if r["eval_success_latest"] is None else f"{r['eval_success_latest']:.2f} ({r['eval_step_latest']:,})"
        print(
            f"| {r['run']} | {succ} | {latest} | {pct(r['collapsed_share'])} of {r['updates']} | {pct(r['lambda_gt_1e4_share'])} | {pct(r['loss_zero_share'])} "
            f"| {num(r['lambda_max'])} | {num(r['loss_min'])} | {num(r['trace_ratio_median'])} | {pct(r['last_hidden_zero_share_end'])} | {rank} | {r['feature_norm_online_zero']} | {r['passes']} |"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
