"""One line per single-task run from its TensorBoard events: the training episodes' success at the
end, the first rollout where it reached 0.5, and the periodic evaluation's curve (docs/results.md, §2).

    python -m tools.rl_rows RUN_DIR [RUN_DIR ...] [--json FILE]

Training success is SB3's ``rollout/success_rate`` (the share of the last 100 finished training
episodes with a success), logged once per rollout; the curve is ``eval/success`` at each evaluation
(the suite's evaluation positions), and the end-of-task evaluation from ``results.json``. Works on collected runs (results/) and on run folders alike.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def scalars(run: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of ``tag`` over every event file of the run, by step (a resumed run's later
    file wins where steps repeat)."""
    points: dict[int, float] = {}
    for events in sorted((run / "tb").rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            points.update((e.step, e.value) for e in acc.Scalars(tag))
    return sorted(points.items())


def row(run: Path) -> dict[str, object]:
    train = scalars(run, "rollout/success_rate")
    curve = scalars(run, "eval/success")
    first = next((step for step, value in train if value >= 0.5), None)
    return {
        "run": str(run),
        "train_success_end": round(train[-1][1], 2) if train else None,
        "train_success_peak": round(max(v for _, v in train), 2) if train else None,
        "first_step_train_success_0.5": first,
        "eval_curve": [(step, round(value, 2)) for step, value in curve],
        **final_eval(run),
    }


def final_eval(run: Path) -> dict[str, object]:
    """The end-of-task evaluation from ``results.json`` (its last curve point): success on the
    suite's evaluation positions, and on held-out ones and at the last step where recorded."""
    data = json.loads((run / "results.json").read_text())
    (curve,) = data["eval_curves"].values()  # single-task runs
    views = ("success", "success_heldout", "success_last", "success_last_heldout")
    return {
        "eval_positions": (data.get("rules") or {}).get("eval_positions"),
        **{f"final_{v}": round(curve[v][-1], 2) for v in views if curve.get(v)},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = p.parse_args()
    rows = [row(run) for run in args.runs]
    for r in rows:
        curve = " ".join(f"{v:.1f}" for _, v in r["eval_curve"])  # type: ignore[union-attr]
        print(f"{r['run']}: training success {r['train_success_end']} (peak {r['train_success_peak']}), "
              f"first >= 0.5 at {r['first_step_train_success_0.5']}; eval curve {curve}; "
              f"end of task ({r['eval_positions']}): " + " ".join(f"{k[6:]} {v}" for k, v in r.items() if k.startswith("final_")))  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
