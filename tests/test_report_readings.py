"""The report's success readings: ours (any step), the last step, the SPHERE authors' (the last
step, envs 0 and 1) and its bounds for runs that did not record each env's score."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl_moe.report import load_runs
from rl_moe.report.readings import authors_bounds, episodes_per_env, readings_table, run_readings


def test_episode_quotas_and_bounds() -> None:
    assert episodes_per_env(10, 5) == [2, 2, 2, 2, 2] and episodes_per_env(11, 5) == [2, 2, 2, 2, 3] and episodes_per_env(3, 5) == [1, 1, 1]
    q = [2, 2, 2, 2, 2]  # envs 0 and 1 hold 4 of 10 episodes
    assert authors_bounds(0.0, q) == (0.0, 0.0) and authors_bounds(1.0, q) == (1.0, 1.0)
    assert authors_bounds(0.2, q) == (0.0, 0.5)  # 2 successes: envs 0 and 1 hold 0 to 2 of their 4 episodes
    assert authors_bounds(0.8, q) == (0.5, 1.0)  # 8 successes: the other 6 episodes hold at most 6
    assert authors_bounds(0.6, [2]) == (pytest.approx(float("nan"), nan_ok=True),) * 2


def _run(root: Path, seed: int, own: list[float], last: list[float], per_env: list | None) -> None:
    d = root / f"ppo-topk-crl-s{seed}"
    d.mkdir(parents=True)
    tasks = ["a", "b"]
    data = {
        "schema": 1, "suite": "cw10", "algo": "ppo", "method": "topk", "protocol": "crl", "seed": seed, "tasks": tasks,
        "steps_per_task": 100, "finished_tasks": 2, "evaluated_tasks": 2, "complete": True,
        "success_matrix": [[own[0], 0.0], [0.0, own[1]]], "own_success": own, "final_success": [0.0, own[1]],
        "eval_curves": {t: {"steps": [100 * i, 100 * i + 50, 100 * (i + 1)], "success": [0.0, 0.0, own[i]], "success_last": [0.0, 0.0, last[i]]} for i, t in enumerate(tasks)},
        "task_segments": [[0, 100], [100, 200]], "rules": {"episode_length": 500, "eval_positions": "both"},
    }  # fmt: skip
    if per_env is not None:
        data["own_per_env"] = per_env
    (d / "results.json").write_text(json.dumps(data))
    (d / "config.json").write_text(json.dumps({"eval": {"matrix_episodes": 10, "n_envs": 5}}))


def test_readings_of_recorded_and_unrecorded_runs(tmp_path: Path) -> None:
    env = lambda last: {"success": last, "success_last": last}  # noqa: E731
    # seed 0 recorded each env: task a's last step succeeds on envs 0, 2, 3 (0.5 on envs 0-1); task b's on env 1 only
    _run(tmp_path, 0, [0.8, 0.4], [0.6, 0.2], [env([1.0, 0.0, 1.0, 1.0, 0.0]), env([0.0, 1.0, 0.0, 0.0, 0.0])])
    # seed 1 did not: task a's last step 0.8 (envs 0-1 between 0.5 and 1), task b's 0.0
    _run(tmp_path, 1, [1.0, 0.2], [0.8, 0.0], None)
    runs = sorted(load_runs([tmp_path]).runs, key=lambda r: r.seed)
    r0, r1 = (run_readings(r) for r in runs)
    assert r0.any_step == (0.8, 0.4) and r0.last_step == (0.6, 0.2) and r0.authors == (0.5, 0.5)
    assert all(v != v for v in r0.authors_low)  # recorded: no bounds needed
    assert r1.last_step == (0.8, 0.0) and all(v != v for v in r1.authors)
    assert r1.authors_low == (0.5, 0.0) and r1.authors_high == (1.0, 0.0)
    table = readings_table("cw10", "ppo", "crl", {"topk": tuple(runs)}, ["topk"])
    assert table is not None
    (row,) = table.rows
    # ours: seeds' averages 0.6 and 0.6; last step 0.4 and 0.4; authors' 0.5 (one seed); bounds 0.25 to 0.5 (one seed)
    assert row == ("topk", "0.60 ± 0.00 (2)", "0.40 ± 0.00 (2)", "0.50 (1)", "0.25 to 0.50 (1; exact in 0)", "—")
