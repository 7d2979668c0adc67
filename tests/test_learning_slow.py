"""Learning to a threshold (slow; run with ``-m slow``): the pipeline really learns, end to end."""

import json
from pathlib import Path

import pytest

from rl_moe.crl import main


@pytest.mark.slow
@pytest.mark.parametrize("method", ["topk", "sphere"])
def test_td3_moe_solves_the_first_smoke_task(tmp_path: Path, method: str) -> None:
    run_dir = tmp_path / "run"
    # The suite's own budget, networks and TD3 preset: what `--suite smoke --algo td3` runs.
    argv = ["--suite", "smoke", "--algo", "td3", "--method", method, "--tasks", "1", "--run-dir", str(run_dir), "--no-progress"]
    assert main(argv) == 0
    results = json.loads((run_dir / "results.json").read_text())
    assert results["complete"]
    assert results["own_success"][0] >= 0.5


@pytest.mark.slow
def test_ppo_topk_moe_solves_faucet_close_at_the_full_budget(tmp_path: Path, faucet_suite: Path) -> None:
    # SPHERE Table 13 (RL, 1M steps): 1.00 +- 0.00 for Top-K MoE; about 30-60 min on one core.
    run_dir = tmp_path / "run"
    argv = ["--suite", str(faucet_suite), "--method", "topk", "--seed", "0", "--run-dir", str(run_dir),
            "--no-progress", "--set", "probe.enabled=false"]  # fmt: skip
    assert main(argv) == 0
    results = json.loads((run_dir / "results.json").read_text())
    assert results["own_success"][0] >= 0.9
