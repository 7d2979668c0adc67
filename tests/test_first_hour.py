"""What a new user meets in the first runs: a ``--run-dir`` full of their own files is refused, an
interruption says what it actually saved and the resume what it starts from, and the seconds before
the progress line say what fills them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from stable_baselines3.common.callbacks import BaseCallback

from rl_moe.continual import scheduler
from rl_moe.continual.resume import saved_progress
from rl_moe.crl import main
from rl_moe.rundir import check_new_run_folder
from tests.conftest import CLI_TINY

SMOKE = ["--suite", "smoke", "--tasks", "2", "--steps-per-task", "256", *CLI_TINY]


# ---- --run-dir -----------------------------------------------------------------------------------
def test_a_folder_of_the_users_own_files_is_refused_and_left_as_it_was(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    mine = tmp_path / "thesis"
    (mine / "data").mkdir(parents=True)
    (mine / "notes.txt").write_text("keep me")
    before = sorted(p.name for p in mine.rglob("*"))
    os.utime(mine, (1_000_000, 1_000_000))
    assert main([*SMOKE, "--run-dir", str(mine)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: --run-dir '{mine}' is not empty and not a run folder (it holds data, notes.txt); give a new or empty folder, or a run folder to resume"
    ]
    assert sorted(p.name for p in mine.rglob("*")) == before and (mine / "notes.txt").read_text() == "keep me"
    assert mine.stat().st_mtime == 1_000_000  # refused before anything was made in it, even a write check


@pytest.mark.parametrize("flag", ["--out", "--run-dir"])
def test_an_empty_folder_name_exits_2_and_writes_nothing(flag: str, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main([*SMOKE, flag, ""]) == 2
    assert capsys.readouterr().err == f"error: {flag} is empty; give a folder (the runs root defaults to runs)\n"
    assert list(tmp_path.iterdir()) == []


def test_new_empty_and_run_folders_are_accepted(tmp_path: Path) -> None:
    check_new_run_folder(tmp_path / "new")
    (tmp_path / "empty").mkdir()
    check_new_run_folder(tmp_path / "empty")
    begun = tmp_path / "begun"  # a sweep writes its log before the run starts; a kill can leave the lock
    begun.mkdir()
    (begun / "sweep.log").write_text("")
    (begun / ".lock").write_text("1")
    check_new_run_folder(begun)
    run = tmp_path / "run"  # a run folder may hold the user's notes beside its own files
    (run / "tb").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    (run / "notes.txt").write_text("")
    check_new_run_folder(run)
    (begun / "positions-25.json").write_text("{}")
    (begun / "plot.png").write_bytes(b"")
    with pytest.raises(ValueError, match=r"it holds plot\.png\)"):
        check_new_run_folder(begun)


# ---- interruption and resume ---------------------------------------------------------------------
def _results(run: Path, **fields: object) -> None:
    run.mkdir(parents=True, exist_ok=True)
    (run / "results.json").write_text(json.dumps(fields))


def test_what_an_interruption_saved_is_said_as_it_is(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert saved_progress(run, 10, True) == (
        "nothing was saved: task 1/10 stopped before its first update had finished, so a resume starts it from its first step"
    )
    _results(run, finished_tasks=2, evaluated_tasks=2)
    assert saved_progress(run, 10, False) == (
        "tasks 1-2 are saved; the learner keeps no in-task checkpoint of task 3/10, so a resume starts it from its first step"
    )
    _results(run, finished_tasks=1, evaluated_tasks=0, in_task={"task_start": 1000, "step": 3048})
    assert saved_progress(run, 10, True).startswith("task 1 is saved (task 1's evaluation runs again on resume); task 2/10 stopped")
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "in_task.pkl").write_bytes(b"")
    assert saved_progress(run, 10, True) == (
        "task 1 is saved (task 1's evaluation runs again on resume), and task 2/10 is saved up to its step 2,048, where a resume continues"
    )


class _StopAtRollout(BaseCallback):
    """Ctrl-C at the start of rollout ``n`` (0: the first, before any update)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n, self.seen = n, 0

    def _on_rollout_start(self) -> None:
        if self.seen == self.n:
            raise KeyboardInterrupt
        self.seen += 1

    def _on_step(self) -> bool:
        return True


@pytest.mark.parametrize("rollout", [0, 2])
def test_an_interrupted_run_and_its_resume_say_what_was_kept(rollout: int, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    original = scheduler.ContinualScheduler._learn

    def learn(self: scheduler.ContinualScheduler, i: int, steps: int, hooks: scheduler.TaskCallbacks) -> None:
        hooks.callbacks.append(_StopAtRollout(rollout))  # after the in-task checkpoint's capture
        original(self, i, steps, hooks)

    run = tmp_path / "run"
    # with the progress line, whose last frame shows what a resume keeps
    argv = [*(a for a in SMOKE if a != "--no-progress"), "--algo", "ppo", "--set", "ppo.n_steps=32", "--set", "checkpoint.every_steps=0", "--run-dir", str(run)]
    with monkeypatch.context() as m:
        m.setattr(scheduler.ContinualScheduler, "_learn", learn)
        assert main(argv) == 130
    out, err = capsys.readouterr()
    # the seconds before training are accounted for
    assert "collecting 32 observations of the held-out tasks for the plasticity probe (once per run)" in out
    assert "[task 1/2 pendulum-0] building its envs and the model, then evaluating the policy on it before training" in out
    saved = "nothing was saved: task 1/2 stopped before its first update had finished" if rollout == 0 else "task 1/2 is saved up to its step 128,"
    assert f"interrupted; {saved}" in err, err
    last_frame = err.split("interrupted;")[0].split("\r")[-1]
    assert "stopped (saved at this step)" in last_frame and f"{128 if rollout else 0:>9,}/" in last_frame, last_frame
    assert main(["--resume", str(run), "--no-progress"]) == 0
    out, err = capsys.readouterr()
    said = "task 1/2 starts from its first step: nothing of it was saved" if rollout == 0 else "resuming task 1/2 inside, at its step 128"
    assert said in err and "collecting" not in out, (out, err)
    first = "[task 1/2 pendulum-0] building its envs and the model" + (", then evaluating the policy on it before training" if rollout == 0 else "\n")
    assert first in out  # a resume inside the task skips its start evaluation
