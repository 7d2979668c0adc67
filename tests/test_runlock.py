"""One writer per run folder: the OS lock, the CLI's refusal and the sweep's skip."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rl_moe.crl import main
from rl_moe.runlock import Holder, RunLock, RunLocked, lock_holder
from rl_moe.sweep import SweepConfig, grid, run_sweep

TINY = ["--suite", "smoke", "--tasks", "1", "--steps-per-task", "64", "--preset", "tiny", "--no-progress"]


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_second_writer_exits_2_naming_the_holder_and_writes_nothing(tmp_path: Path, stop_before_task, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    assert stop_before_task([*TINY, "--tasks", "2", "--run-dir", str(run)], 1) == 130
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    locks = [RunLock(run).acquire(), RunLock(fresh).acquire()]  # stand in for runs still training there
    try:
        assert lock_holder(run) == Holder(os.getpid())
        before = {d: tree(d) for d in (run, fresh)}
        capsys.readouterr()
        attempts = [
            [*TINY, "--tasks", "2", "--run-dir", str(run)],  # the same command again
            ["--resume", str(run), "--set", "ppo.lr_start=1e-4"],  # would rewrite config.json
            [*TINY, "--run-dir", str(fresh)],
        ]
        for argv in attempts:
            assert main(argv) == 2, argv
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and f"is in use by process {os.getpid()}" in err[0], err
            assert {d: tree(d) for d in (run, fresh)} == before
        with pytest.raises(RunLocked):
            RunLock(run).acquire()
    finally:
        for lock in locks:
            lock.release()
    assert lock_holder(run) is None
    assert main(["--resume", str(run)]) == 0  # free again: the run finishes


def test_a_killed_writer_leaves_no_stale_lock(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    code = f"from rl_moe.runlock import RunLock; import time; lock = RunLock({str(run)!r}).acquire(); print('locked', flush=True); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "locked"
        assert lock_holder(run) == Holder(child.pid)
        with pytest.raises(RunLocked, match=f"process {child.pid}"):
            RunLock(run).acquire()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert lock_holder(run) is None  # the kernel dropped the lock with the process
    RunLock(run).acquire().release()


def test_sweep_skips_trials_whose_folder_is_in_use(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from rl_moe.sweep import Outcome, Trial

    ran: list[int] = []

    def runner(trial: Trial, command: list[str], env: dict[str, str]) -> Outcome:
        ran.append(trial.seed)
        return Outcome(trial, "done")

    cfg = SweepConfig(suites=("smoke",), methods=("topk",), seeds=(0, 1), out=tmp_path)
    busy_dir = next(t.run_dir for t in grid(cfg) if t.seed == 1)
    busy_dir.mkdir(parents=True)
    lock = RunLock(busy_dir).acquire()
    try:
        outcomes = run_sweep(cfg, "sequential", runner)
    finally:
        lock.release()
    assert ran == [0]
    assert {o.trial.seed: o.status for o in outcomes} == {0: "done", 1: "busy"}
    assert f"busy    smoke/ppo-topk-crl-s1 (in use by process {os.getpid()}; skipped)" in capsys.readouterr().out


def test_sweep_rechecks_each_trial_as_it_launches(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A second sweep over the same grid takes seed 1 and finishes seed 2 while this one runs seed
    0: this sweep leaves both alone (busy, skipped) instead of running them or calling them failed."""
    import json

    from rl_moe.sweep import Outcome, Trial

    cfg = SweepConfig(suites=("smoke",), methods=("topk",), seeds=(0, 1, 2), out=tmp_path)
    dirs = {t.seed: t for t in grid(cfg)}
    ran: list[int] = []
    held: list[RunLock] = []

    def runner(trial: Trial, command: list[str], env: dict[str, str]) -> Outcome:
        ran.append(trial.seed)
        dirs[1].run_dir.mkdir(parents=True)
        held.append(RunLock(dirs[1].run_dir).acquire())
        dirs[2].run_dir.mkdir(parents=True)
        (dirs[2].run_dir / "results.json").write_text(json.dumps({"complete": True, "tasks": ["t"] * (dirs[2].tasks or 1)}))
        return Outcome(trial, "done")

    try:
        outcomes = run_sweep(cfg, "sequential", runner)
    finally:
        for lock in held:
            lock.release()
    assert ran == [0]
    assert {o.trial.seed: o.status for o in outcomes} == {0: "done", 1: "busy", 2: "skipped"}
    out = capsys.readouterr().out
    assert f"busy    smoke/ppo-topk-crl-s1 (in use by process {os.getpid()}; skipped)" in out and "failed" not in out


def test_a_launch_that_loses_the_lock_race_is_busy_not_failed(tmp_path: Path) -> None:
    """The CLI takes the lock after its imports: a trial launched in that window exits 2 ("in use")
    while the other process holds the folder. Exit 2 with a free folder stays a failure."""
    from rl_moe.sweep import Outcome, Trial

    cfg = SweepConfig(suites=("smoke",), methods=("topk",), seeds=(0, 1), out=tmp_path)
    held: list[RunLock] = []

    def runner(trial: Trial, command: list[str], env: dict[str, str]) -> Outcome:
        trial.run_dir.mkdir(parents=True)
        if trial.seed == 0:  # the other sweep's process got there first and still runs
            held.append(RunLock(trial.run_dir).acquire())
        return Outcome(trial, "failed", returncode=2, log=str(trial.run_dir / "sweep.log"))

    try:
        outcomes = run_sweep(cfg, "sequential", runner)
    finally:
        for lock in held:
            lock.release()
    assert {o.trial.seed: o.status for o in outcomes} == {0: "busy", 1: "failed"}


def test_stale_temp_files_of_a_killed_run_are_removed_on_resume(tmp_path: Path, stop_before_task) -> None:
    run = tmp_path / "run"
    assert stop_before_task([*TINY, "--tasks", "2", "--run-dir", str(run)], 1) == 130
    stale = [run / ".results.json.k3j9x.tmp", run / "checkpoints" / ".task_01_pendulum-1.zip.a8b2c.tmp"]
    kept = [run / "notes.tmp", run / "checkpoints" / "mine.tmp.txt"]
    for p in (*stale, *kept):
        p.write_bytes(b"x" * 100)
    assert main(["--resume", str(run), "--no-progress"]) == 0
    assert not any(p.exists() for p in stale)
    assert all(p.exists() for p in kept)


def test_a_finished_run_removes_its_lock_file_and_a_killed_one_leaves_it_free(tmp_path: Path) -> None:
    from rl_moe.crl import main

    out = tmp_path / "runs"
    assert main(["--suite", "smoke", "--tasks", "1", "--steps-per-task", "256", "--preset", "tiny", "--no-progress", "--out", str(out)]) == 0
    (run,) = [p for p in out.glob("*/*") if p.is_dir()]
    assert not (run / ".lock").exists()
    lock = RunLock(run).acquire()
    assert (run / ".lock").exists()
    lock.release()
    assert not (run / ".lock").exists()


def test_a_lock_taken_on_a_removed_file_is_retried_on_the_new_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race the removal opens: B opens the file, A removes it and unlocks, B locks the orphan."""
    import rl_moe.runlock as runlock

    run = tmp_path / "run"
    run.mkdir()
    first = RunLock(run).acquire()
    real_try = runlock._try_lock
    calls = []

    def release_in_between(fh):  # A releases after B's open, before B's lock
        if not calls:
            first.release()
        calls.append(fh)
        return real_try(fh)

    monkeypatch.setattr(runlock, "_try_lock", release_in_between)
    second = RunLock(run).acquire()
    assert len(calls) == 2  # the orphan inode was refused, the new file taken
    assert lock_holder(run) == Holder(os.getpid())
    second.release()
