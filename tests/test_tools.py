"""The evidence scripts in tools/: known answers on committed run summaries, and what they copy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tools import collect_runs, same_training, screen_summary

RESULTS = Path(__file__).resolve().parents[1] / "results"


def test_screen_summary_reads_a_kept_and_a_collapsed_run() -> None:
    """docs/results.md §6 and §5's numbers, from the committed summaries: loss_ratio seed 0 keeps
    its features (no collapsed update of 62, r_e(K) 5.54 at the end); the paper rule's slice seed 3
    is collapsed in every one of its 186 updates."""
    kept = screen_summary.summarize(RESULTS / "sphere-screen" / "lossratio-s0")
    assert (kept["success"], kept["updates"], kept["collapsed_share"], kept["passes"]) == (1.0, 62, 0.0, True)
    assert kept["entk_rank_end"] == pytest.approx(5.544, abs=1e-3)
    assert kept["feature_norm_online_zero"] == "0 of 9"
    collapsed = screen_summary.summarize(RESULTS / "cw10-paper" / "ppo-sphere-crl-s3")
    assert (collapsed["updates"], collapsed["collapsed_share"], collapsed["passes"]) == (186, 1.0, False)


def test_collect_runs_keeps_summaries_and_leaves_checkpoints(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "suite" / "ppo-topk-crl-s0"
    (run / "checkpoints").mkdir(parents=True)
    (run / "tb").mkdir()
    for name in ("config.json", "results.json", "sweep.log", "positions-25.json", "checkpoints/task0.zip", "tb/events.out.x", "other.txt"):
        (run / name).write_text(name)
    (tmp_path / "out" / "suite" / "ppo-topk-crl-s0").mkdir(parents=True)
    (tmp_path / "out" / "suite" / "ppo-topk-crl-s0" / "stale.json").write_text("old")  # replaced whole
    copied = collect_runs.collect(tmp_path / "runs", tmp_path / "out")
    assert copied == [tmp_path / "out" / "suite" / "ppo-topk-crl-s0"]
    got = sorted(str(p.relative_to(copied[0])) for p in copied[0].rglob("*") if p.is_file())
    assert got == ["config.json", "positions-25.json", "results.json", "sweep.log", "tb/events.out.x"]


def test_same_training_tells_identical_runs_from_changed_ones(tmp_path: Path) -> None:
    """Two copies of one committed run are identical; a changed number in results.json is not."""
    src = RESULTS / "sphere-screen" / "lossratio-s0"
    a, b = tmp_path / "a", tmp_path / "b"
    for dst in (a, b):
        shutil.copytree(src, dst)
    assert same_training.compare({"a": a, "b": b})["identical"] is True
    res = json.loads((b / "results.json").read_text())
    res["own_success"][0] = 0.9
    (b / "results.json").write_text(json.dumps(res))
    verdict = same_training.compare({"a": a, "b": b})
    assert verdict["identical"] is False and verdict["same"] == {"weights": True, "scalars": True, "scalar_tags": True, "results": False}
