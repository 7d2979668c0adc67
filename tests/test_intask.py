"""In-task checkpoints (rl_moe.continual.intask): a run killed inside a task resumes at its last
rollout boundary and equals the uninterrupted run bit for bit on the official envs."""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from rl_moe.continual import intask
from rl_moe.crl import main
from rl_moe.rundir import RunDir
from rl_moe.sweep.trials import trained_steps
from tests.conftest import import_error_from

SMOKE = ["--suite", "smoke", "--method", "sphere", "--tasks", "2", "--steps-per-task", "1024", "--preset", "tiny", "--no-progress", "--set", "checkpoint.every_steps=200"]


def _params(run: Path) -> dict[str, dict[str, torch.Tensor]]:
    out = {}
    for z in sorted((run / "checkpoints").glob("*.zip")):
        with zipfile.ZipFile(z) as f:
            out[z.name] = torch.load(io.BytesIO(f.read("policy.pth")), weights_only=True)
    return out


def _scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    # time/* are wall-clock figures; everything else must match
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"] if not t.startswith("time/")}


def _same(full: Path, cut: Path) -> None:
    pa, pb = _params(full), _params(cut)
    assert pa.keys() == pb.keys() and len(pa) == 2
    for name in pa:
        for key in pa[name]:
            assert torch.equal(pa[name][key], pb[name][key]), (name, key)
    ra, rb = (json.loads((p / "results.json").read_text()) for p in (full, cut))
    assert ra["eval_curves"] == rb["eval_curves"] and ra["success_matrix"] == rb["success_matrix"]
    assert rb["complete"] and rb["in_task"] is None
    assert _scalars(full) == _scalars(cut)
    left = sorted(p.name for p in (cut / "checkpoints").iterdir() if not p.name.startswith("task_"))
    assert left == [], left  # no in-task checkpoint and no temp file once the run is complete


def _cli(argv: list[str]) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "rl_moe.crl", *argv], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_for_checkpoint(run: Path, proc: subprocess.Popen, after: float) -> bool:
    """Until an in-task checkpoint newer than ``after`` exists (False: the process ended first)."""
    path = RunDir(run).in_task
    while proc.poll() is None:
        if path.is_file() and path.stat().st_mtime > after:
            return True
        time.sleep(0.02)
    return False


def _interrupt_at_boundary(run: Path, n: int, extra: tuple[str, ...] = (), interrupt: Callable[[], BaseException] = KeyboardInterrupt) -> int:
    """Run SMOKE (with ``extra``) into ``run`` with a Ctrl-C (``interrupt()``) right after the
    ``n``-th rollout boundary's capture."""
    original = intask.InTaskCheckpoint._on_rollout_start
    calls = {"n": 0}

    def stop(self):  # type: ignore[no-untyped-def]
        original(self)
        calls["n"] += 1
        if calls["n"] == n:
            raise interrupt()

    with pytest.MonkeyPatch.context() as m:
        m.setattr(intask.InTaskCheckpoint, "_on_rollout_start", stop)
        return main([*SMOKE, *extra, "--run-dir", str(run)])


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("full") / "run"
    proc = _cli([*SMOKE, "--run-dir", str(run)])
    assert proc.wait(timeout=300) == 0, proc.stderr.read() if proc.stderr else ""
    return run


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_killed_several_times_inside_tasks_resumes_bit_for_bit(tmp_path: Path, uninterrupted: Path, sig: signal.Signals) -> None:
    rng = random.Random(7 + int(sig))
    run = tmp_path / "run"
    argv = [*SMOKE, "--run-dir", str(run)]
    kills = 0
    for attempt in range(12):
        proc = _cli(argv if attempt == 0 else ["--resume", str(run), "--no-progress"])
        if kills < 3 and _wait_for_checkpoint(run, proc, time.time()):
            time.sleep(rng.uniform(0.0, 0.4))  # a random point: mid-rollout, mid-update or mid-write
            if proc.poll() is None:
                proc.send_signal(sig)
                rc = proc.wait(timeout=120)
                err = proc.stderr.read() if proc.stderr else ""
                if sig == signal.SIGTERM:
                    assert rc in (0, 130), err  # saved like a Ctrl-C (or it had just finished)
                    assert "Traceback" not in err
                kills += 1
                continue
        assert proc.wait(timeout=300) == 0, proc.stderr.read() if proc.stderr else ""
        break
    assert kills >= 2
    _same(uninterrupted, run)


def test_a_ctrl_c_that_surfaces_as_an_import_error_saves_the_boundary_too(tmp_path: Path, uninterrupted: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    # Steps-only interval far away: only the interrupt's flush writes the boundary.
    never = ("--set", "checkpoint.every_steps=1000000", "--set", "checkpoint.every_minutes=0")
    assert _interrupt_at_boundary(run, 3, never, lambda: import_error_from(KeyboardInterrupt())) == 130
    assert "Resume with: python -m rl_moe.crl --resume" in capsys.readouterr().err
    state = intask.read(RunDir(run).in_task)
    assert state is not None and state["task"] == 0 and state["step"] > 0
    assert main(["--resume", str(run), "--no-progress"]) == 0
    _same(uninterrupted, run)


def test_sigterm_writes_the_last_boundary_before_it_exits(tmp_path: Path) -> None:
    run = tmp_path / "run"
    # Steps-only interval far away: nothing is written unless the signal makes the run write.
    proc = _cli([*SMOKE, "--set", "checkpoint.every_steps=1000000", "--set", "checkpoint.every_minutes=0", "--run-dir", str(run)])
    results = RunDir(run).results
    while proc.poll() is None:  # until the first task is half-way
        if results.is_file() and any(Path(run, "tb").glob("events.*")):
            data = json.loads(results.read_text())
            if data.get("finished_tasks") == 0 and _logged_beyond(run, 300):
                break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 130
    state = intask.read(RunDir(run).in_task)
    assert state is not None and state["task"] == 0 and state["step"] > 0
    assert json.loads(results.read_text())["in_task"] == {"task_start": 0, "step": state["step"]}


def _logged_beyond(run: Path, step: int) -> bool:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"), size_guidance={"scalars": 1})
    acc.Reload()
    return any(acc.Scalars(t)[-1].step > step for t in acc.Tags()["scalars"] if t.startswith("train/"))


@pytest.mark.parametrize("damage", ["garbage", "truncated", "other_task"])
def test_an_unusable_in_task_checkpoint_restarts_the_task_with_one_line(tmp_path: Path, uninterrupted: Path, capsys: pytest.CaptureFixture, damage: str) -> None:
    run = tmp_path / "run"
    assert _interrupt_at_boundary(run, 3) == 130
    path = RunDir(run).in_task
    blob = path.read_bytes()
    if damage == "garbage":
        path.write_bytes(b"not a checkpoint")
    elif damage == "truncated":
        path.write_bytes(blob[: len(blob) // 2])
    else:
        state = pickle.loads(blob)
        state["task"] = 1
        path.write_bytes(pickle.dumps(state))
    capsys.readouterr()
    assert main(["--resume", str(run), "--no-progress"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "in-task checkpoint" in line]
    assert len(notes) == 1 and "restarts from its start" in notes[0], notes
    _same(uninterrupted, run)


def test_results_and_the_sweep_count_the_unfinished_tasks_steps(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"task_segments": [[0, 1024]], "in_task": {"task_start": 1024, "step": 1536}}))
    assert trained_steps(run) == 1024 + 512


def test_envs_restore_bit_for_bit_on_metaworld() -> None:
    """The env state alone: stepping on from a restored snapshot equals stepping on from the
    original, across an episode's end, on MetaWorld's official envs under both position rules."""
    from rl_moe.envs.envstate import restore_env, snapshot_env
    from rl_moe.envs.factories import task_factories
    from rl_moe.envs.suites import load_suite

    for suite_name, index in (("cw10-cw", 0), ("cw10", 1)):
        suite = load_suite(suite_name)
        factory = task_factories(suite, suite.tasks[index], 1, 3)[0]
        actions = np.random.default_rng(0).uniform(-1, 1, (suite.episode_length + 150, 4)).astype(np.float32)

        def play(env, steps):  # type: ignore[no-untyped-def]
            out = []
            for a in steps:
                obs, reward, terminated, truncated, info = env.step(a)
                out.append((obs.copy(), reward, info["is_success"]))
                if terminated or truncated:
                    out.append((env.reset()[0].copy(), 0.0, False))
            return out

        a = factory()
        a.reset()
        play(a, actions[:100])
        snap = snapshot_env(a)
        expected = play(a, actions[100:])
        b = factory()
        b.reset()
        play(b, actions[:37])  # somewhere else entirely
        restore_env(b, snap)
        got = play(b, actions[100:])
        assert len(got) == len(expected)
        for (o1, r1, s1), (o2, r2, s2) in zip(expected, got):
            assert np.array_equal(o1, o2) and r1 == r2 and s1 == s2
        a.close()
        b.close()


def test_a_run_folder_copied_elsewhere_resumes_inside_its_task(tmp_path: Path, uninterrupted: Path) -> None:
    import shutil

    run = tmp_path / "here" / "run"
    assert _interrupt_at_boundary(run, 4) == 130
    assert intask.read(RunDir(run).in_task) is not None
    moved = tmp_path / "elsewhere" / "run"
    shutil.copytree(run, moved)
    shutil.rmtree(run)  # nothing of the first place is left to lean on
    assert main(["--resume", str(moved), "--no-progress"]) == 0
    _same(uninterrupted, moved)
