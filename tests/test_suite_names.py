"""``cw10`` is the SPHERE paper's protocol, ``cw10-cw`` Continual World's; ``cw10-paper`` is an
alias of ``cw10``, and run folders and results from before the rename keep the rules they recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl_moe.crl import main
from rl_moe.envs.suites import current_suite_name, load_suite
from rl_moe.report import load_runs
from tests.conftest import CLI_TINY

from tests.test_report import results, write_run

TINY = CLI_TINY


def test_the_alias_is_the_suite_itself() -> None:
    assert load_suite("cw10-paper").to_dict() == load_suite("cw10").to_dict()
    assert load_suite("cw10-paper").name == "cw10"  # a run started under the alias records cw10


@pytest.mark.parametrize(
    ("recorded", "episode_length", "today"),
    [
        ("cw10", None, "cw10-cw"),  # results from before runs recorded their rules: the old cw10
        ("cw10", 200, "cw10-cw"),
        ("cw20", 200, "cw20-cw"),
        ("cw10", 500, "cw10"),  # cw10 since it became the paper's protocol
        ("cw10-paper", None, "cw10"),
        ("cw10-paper", 500, "cw10"),
        ("cw10-cw", 200, "cw10-cw"),
        ("paper-hammer", 500, "paper-hammer"),  # a user suite keeps its name
    ],
)
def test_current_suite_name(recorded: str, episode_length: int | None, today: str) -> None:
    assert current_suite_name(recorded, episode_length) == today


def _as_made_before_the_rename(run: Path) -> None:
    """Rewrite a ``cw10-cw`` run folder into what the same run wrote when ``cw10`` named those rules."""
    cfg = json.loads((run / "config.json").read_text())
    cfg["suite"], cfg["suite_data"]["name"] = "cw10", "cw10"
    (run / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    res = json.loads((run / "results.json").read_text())
    res["suite"] = "cw10"
    (run / "results.json").write_text(json.dumps(res))


def test_a_folder_made_under_the_old_cw10_resumes_with_its_recorded_rules(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "old"
    assert main(["--suite", "cw10-cw", "--method", "topk", "--tasks", "1", "--steps-per-task", "128", *TINY, "--run-dir", str(run)]) == 0
    _as_made_before_the_rename(run)
    stored = json.loads((run / "config.json").read_text())["suite_data"]
    capsys.readouterr()

    # today's cw10 is another protocol: its alias is refused, naming the stored suite
    assert main(["--suite", "cw10-paper", "--tasks", "2", "--run-dir", str(run), "--no-progress"]) == 2
    assert "--suite cw10-paper conflicts with the resumed run's stored 'cw10'" in capsys.readouterr().err

    # the command as typed then resumes it, under the rules it recorded
    assert main(["--suite", "cw10", "--method", "topk", "--tasks", "2", "--steps-per-task", "128", *TINY, "--run-dir", str(run)]) == 0
    out = capsys.readouterr().out
    assert "it keeps the rules it recorded, which are 'cw10-cw''s now" in out
    res = json.loads((run / "results.json").read_text())
    assert res["complete"] and res["finished_tasks"] == 2 and res["suite"] == "cw10"
    assert res["rules"]["episode_length"] == 200 and res["rules"]["task_fields"] == {} and res["rules"]["grad_clip"] == "joint"
    assert json.loads((run / "config.json").read_text())["suite_data"] == stored


def test_todays_name_of_the_recorded_rules_resumes_too(tmp_path: Path) -> None:
    run = tmp_path / "old"
    assert main(["--suite", "cw10-cw", "--method", "topk", "--tasks", "1", "--steps-per-task", "128", *TINY, "--run-dir", str(run)]) == 0
    _as_made_before_the_rename(run)
    assert main(["--suite", "cw10-cw", "--tasks", "2", "--run-dir", str(run), "--no-progress"]) == 0
    assert json.loads((run / "results.json").read_text())["finished_tasks"] == 2


def test_an_alias_run_resumes_under_the_suites_name(tmp_path: Path) -> None:
    run = tmp_path / "paper"
    assert main(["--suite", "cw10-paper", "--method", "topk", "--tasks", "1", "--steps-per-task", "128", *TINY, "--run-dir", str(run)]) == 0
    assert json.loads((run / "results.json").read_text())["suite"] == "cw10"
    assert main(["--suite", "cw10", "--tasks", "2", "--run-dir", str(run), "--no-progress"]) == 0
    res = json.loads((run / "results.json").read_text())
    assert res["finished_tasks"] == 2 and res["rules"]["episode_length"] == 500 and res["rules"]["task_fields"] == {"position_rule": "fixed"}


def test_the_report_groups_by_rules_not_names(tmp_path: Path) -> None:
    tasks = ["hammer-v3", "push-wall-v3"]
    paper = {"episode_length": 500, "task_fields": {"positions": "fixed"}, "grad_clip": "separate", "eval_positions": "both"}
    cw = {"episode_length": 200, "task_fields": {}, "grad_clip": "joint", "eval_positions": "heldout"}
    for seed, (suite, rules) in enumerate([("cw10-paper", paper), ("cw10", paper), ("cw10", cw), ("cw10", None), ("cw10-cw", cw)]):
        data = results("topk", "crl", seed, [1.0, 0.5], suite=suite, tasks=tasks)
        if rules is not None:
            data["rules"] = rules
        write_run(tmp_path / str(seed), data)
    groups = {key.suite: sorted(r.seed for r in runs) for key, runs in load_runs([tmp_path]).groups.items()}
    # the alias and today's cw10 pool; the old cw10 (recorded rules or none) joins cw10-cw, where
    # the seed without recorded rules is a group of its own (and so both are named by their rules)
    named = "cw10-cw [200-step episodes, joint gradient clipping, evaluated on heldout positions]"
    assert groups == {"cw10": [0, 1], named: [2, 4], "cw10-cw [rules not recorded]": [3]}
