"""``python -m rl_moe.positions``: a run's checkpoints scored on many held-out positions, the
run's own eval envs first (so at the run's own count it reproduces the run's end-of-task scores)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl_moe.crl import main as crl
from rl_moe.positions import main
from tests.conftest import needs_envpool


def argv(suite: str = "cw10", vec_env: str = "dummy") -> list[str]:
    """A tiny two-task run (hammer, push-wall) of ``suite`` on ``vec_env``."""
    return ["--suite", suite, "--method", "topk", "--tasks", "2", "--steps-per-task", "256", "--preset", "tiny", "--vec-env", vec_env,
            "--no-progress", "--set", "eval.evals_per_task=1", "--set", "probe.enabled=false"]  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("positions") / "run"
    assert crl([*argv(), "--run-dir", str(path)]) == 0
    return path


def test_at_the_runs_own_count_it_reproduces_the_end_of_task_scores(run: Path) -> None:
    results = json.loads((run / "results.json").read_text())
    n_envs = json.loads((run / "config.json").read_text())["eval"]["n_envs"]
    assert main([str(run), "--heldout", str(n_envs)]) == 0
    out = json.loads((run / f"positions-{n_envs}.json").read_text())
    assert out["tasks"] == ["hammer-v3", "push-wall-v3"] and out["heldout_positions"] == n_envs
    for i, task in enumerate(out["tasks"]):
        curve = results["eval_curves"][task]
        assert out["own_success_train"][i] == results["success_matrix"][i][i]
        assert out["own_return_train"][i] == pytest.approx(curve["return"][-1], rel=1e-9)
        assert out["own_return_heldout"][i] == pytest.approx(curve["return_heldout"][-1], rel=1e-9)
    assert len(out["last_checkpoint_heldout"]) == 2


@needs_envpool
def test_a_pool_run_is_scored_on_the_pool_it_evaluated_on(tmp_path: Path) -> None:
    """Under ``cw10-cw`` on EnvPool, push-wall trains and evaluates on the pool (hammer stays on the
    official envs): the official envs' positions would give other returns."""
    run = tmp_path / "run"
    assert crl([*argv("cw10-cw", "envpool"), "--run-dir", str(run)]) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["provenance"][-1]["backend"].startswith("envpool")
    evals = json.loads((run / "config.json").read_text())["eval"]
    assert evals["positions"] == "heldout"  # the protocol's curves are the held-out positions'
    assert main([str(run), "--heldout", str(evals["n_envs"])]) == 0
    out = json.loads((run / f"positions-{evals['n_envs']}.json").read_text())
    assert out["vec_env"] == "envpool"
    for i, task in enumerate(out["tasks"]):
        assert out["own_return_heldout"][i] == pytest.approx(results["eval_curves"][task]["return"][-1], rel=1e-9), task


def test_more_positions_extend_the_runs_own(run: Path) -> None:
    assert main([str(run), "--heldout", "6"]) == 0
    out = json.loads((run / "positions-6.json").read_text())
    assert out["heldout_positions"] == 6 and len(out["own_return_heldout"]) == 2
    from rl_moe import __version__
    from rl_moe.provenance import code_version

    assert out["scored_by"] == {**code_version(), "version": __version__, "tool": "python -m rl_moe.positions"}
    assert out["scored_by"]["commit"] is None or len(out["scored_by"]["commit"]) == 40
    assert all(0.0 <= s <= 1.0 for s in out["own_success_heldout"] + out["last_checkpoint_heldout"])


@pytest.mark.parametrize(("args", "message"), [(["--heldout", "0"], "--heldout must be >= 1, got 0"), (["--episodes", "-1"], "--episodes must be >= 1")])
def test_bad_values_exit_2_with_one_line(run: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(run), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_a_folder_that_is_not_a_run_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path)]) == 2
    assert "not a run folder" in capsys.readouterr().err
