"""Sweep: grid and folders, resume-by-skipping, validation errors, sequential, local and Ray backends."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from rl_moe.envs.envpool_env import envpool_installed
from rl_moe.rundir import RunDir

from rl_moe import sweep
from rl_moe.sweep import backends
from rl_moe.sweep import run as sweep_run
from rl_moe.sweep import (
    Outcome, RayOptions, SweepConfig, SweepError, Trial, grid, is_complete, local_slots, main, run_sweep, trial_command,
)  # fmt: skip

# tiny smoke-suite trials: 2 tasks of 128 steps, a 16-unit network, one eval episode
TINY = [
    "--steps-per-task", "128", "--tasks", "2", "--",
    "--set", "ppo.n_steps=64", "--set", "ppo.n_envs=1", "--set", "ppo.batch_size=32", "--set", "ppo.n_epochs=1",
    "--set", "net.hidden=16,16", "--set", "eval.n_episodes=1", "--set", "eval.matrix_episodes=1",
    "--set", "eval.evals_per_task=1", "--set", "probe.n_states=16",
]  # fmt: skip


def fake_results(trial: Trial, own: float) -> dict:
    n = trial.tasks or 1  # as many tasks as the trial asks for, each with success ``own``
    return {
        "schema": 1, "suite": trial.suite, "algo": trial.algo, "method": trial.method, "protocol": trial.protocol,
        "seed": trial.seed, "tasks": [f"t{i}" for i in range(n)], "steps_per_task": 10, "finished_tasks": n, "complete": True,
        "success_matrix": [[own] * n for _ in range(n)], "own_success": [own] * n, "final_success": [own] * n, "eval_curves": {},
        "cl_metrics": {"average_performance": own, "forgetting": 0.0, "forward_transfer": None},
        "task_segments": [[10 * i, 10 * (i + 1)] for i in range(n)],
    }  # fmt: skip


class FakeRunner:
    """Records the commands and writes a complete results.json, except for methods named 'broken'."""

    def __init__(self) -> None:
        self.calls: list[tuple[Trial, list[str], dict[str, str]]] = []

    def __call__(self, trial: Trial, command: list[str], env: dict[str, str]) -> Outcome:
        self.calls.append((trial, command, env))
        if trial.method == "broken":
            return Outcome(trial, "failed", 1)
        trial.run_dir.mkdir(parents=True, exist_ok=True)
        (trial.run_dir / "results.json").write_text(json.dumps(fake_results(trial, 0.1 * trial.seed)))
        return Outcome(trial, "done")


class SlowRunner(FakeRunner):
    """A FakeRunner whose trials take ``seconds`` and record when they ran and how many ran at once."""

    def __init__(self, seconds: float = 0.3) -> None:
        super().__init__()
        self.seconds = seconds
        self.lock = threading.Lock()
        self.running = self.most = 0
        self.started: list[int] = []  # seeds
        self.spans: list[tuple[float, float, str | None]] = []  # (start, end, CUDA_VISIBLE_DEVICES)

    def __call__(self, trial: Trial, command: list[str], env: dict[str, str]) -> Outcome:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.started.append(trial.seed)
        start = time.monotonic()
        time.sleep(self.seconds)
        outcome = super().__call__(trial, command, env)
        with self.lock:
            self.running -= 1
            self.spans.append((start, time.monotonic(), env.get("CUDA_VISIBLE_DEVICES")))
        return outcome


def test_aggregate_env_steps_count_only_what_this_sweep_trained(tmp_path: Path) -> None:
    cfg = SweepConfig(suites=("smoke",), methods=("topk",), seeds=(0, 1), out=tmp_path)
    resumed = grid(cfg)[1].run_dir
    resumed.mkdir(parents=True)
    (resumed / "results.json").write_text(json.dumps({"complete": False, "task_segments": [[0, 4]]}))
    outcomes = run_sweep(cfg, "sequential", FakeRunner())
    assert [o.env_steps for o in outcomes] == [30, 26]  # smoke's 3 tasks x 10; the resumed trial had trained 4
    throughput = json.loads((tmp_path / "sweep.json").read_text())["throughput"]
    assert throughput["env_steps"] == 56
    assert throughput["env_steps_per_s"] == pytest.approx(56 / throughput["seconds"], rel=1e-2)


def test_grid_folders_and_command(tmp_path: Path) -> None:
    cfg = SweepConfig(
        suites=("smoke", "my/suite.json"), methods=("topk", "sphere"), protocols=("crl", "rl"), seeds=(0, 1),
        out=tmp_path, crl_args=("--steps-per-task", "100"),
    )  # fmt: skip
    trials = grid(cfg)
    assert len(trials) == 2 * 2 * 2 * 2
    assert len({t.run_dir for t in trials}) == len(trials)  # one folder per grid point
    assert trials[0].run_dir == tmp_path / "smoke" / "ppo-topk-crl-s0"
    assert trials[-1].run_dir == tmp_path / "suite" / "ppo-sphere-rl-s1"
    cmd = trial_command(trials[9], cfg)  # seed 1's second trial
    assert cmd[:3] == [sys.executable, "-m", "rl_moe.crl"]
    assert cmd[3:] == [
        "--suite", "smoke", "--method", "topk", "--algo", "ppo", "--protocol", "rl", "--seed", "1",
        "--run-dir", str(tmp_path / "smoke" / "ppo-topk-rl-s1"), "--no-progress", "--vec-env", "dummy",
        "--threads", "1", "--steps-per-task", "100",
    ]  # fmt: skip
    # Env workers and threads for the CPUs a trial reserves, unless the user chose.
    assert cmd_flag(replace(cfg, cpus_per_trial=4), "--vec-env") == "subproc"
    assert cmd_flag(replace(cfg, cpus_per_trial=4), "--threads") == "4"
    assert cmd_flag(replace(cfg, crl_args=("--vec-env", "subproc")), "--vec-env") == "subproc"
    assert cmd_flag(replace(cfg, crl_args=("--threads", "2")), "--threads") == "2"
    # MetaWorld trials measure per task between the official envs and EnvPool where it is installed.
    cw10 = replace(cfg, suites=("cw10-cw",))
    assert cmd_flag(cw10, "--vec-env") == ("auto" if envpool_installed() else "dummy")


def cmd_flag(cfg: SweepConfig, flag: str) -> str:
    cmd = trial_command(grid(cfg)[0], cfg)
    assert cmd.count(flag) == 1
    return cmd[cmd.index(flag) + 1]


def test_parse_passthrough_after_double_dash() -> None:
    _, cfg = sweep.parse(["--suite", "smoke", "--method", "topk", "--seed", "3", "4", "--tasks", "2", "--device", "cpu", "--", "--set", "net.hidden=8"])
    assert cfg.seeds == (3, 4) and cfg.crl_args == ("--tasks", "2", "--device", "cpu", "--set", "net.hidden=8")


def test_local_fallback_skips_complete_and_reports_failures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(sweep_run, "ray_available", lambda: False)
    cfg = SweepConfig(suites=("smoke",), methods=("topk",), protocols=("crl", "rl"), seeds=(0, 1), out=tmp_path, cpus_per_trial=2)
    runner = SlowRunner(0.1)
    outcomes = run_sweep(cfg, "auto", runner, RayOptions(num_cpus=4))
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "ray is not installed (pip install 'rl_moe[sweep]'): running 2 trials at a time on this machine"
    assert runner.most == 2  # the local backend, not one after another
    assert [o.status for o in outcomes] == ["done"] * 4 and len(runner.calls) == 4
    assert all(env["OMP_NUM_THREADS"] == "2" for _, _, env in runner.calls)
    checkout = str(Path(sweep.__file__).resolve().parents[2])  # trials elsewhere import this rl_moe
    assert all(env["PYTHONPATH"].split(os.pathsep)[0] == checkout for _, _, env in runner.calls)
    assert (Path(checkout) / "rl_moe" / "sweep" / "__init__.py").is_file()
    assert is_complete(tmp_path / "smoke" / "ppo-topk-rl-s1")
    manifest = json.loads((tmp_path / "sweep.json").read_text())
    assert [t["status"] for t in manifest["trials"]] == ["done"] * 4
    # a second sweep over a larger grid runs only the new trials
    cfg2 = SweepConfig(suites=("smoke",), methods=("topk",), protocols=("crl", "rl"), seeds=(0, 1, 2), out=tmp_path)
    runner2 = FakeRunner()
    outcomes = run_sweep(cfg2, "sequential", runner2)
    assert sorted(o.status for o in outcomes) == ["done", "done", "skipped", "skipped", "skipped", "skipped"]
    assert {t.seed for t, _, _ in runner2.calls} == {2}


def test_failed_trial_gives_exit_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(sweep_run, "validate", lambda cfg, trials: None)  # 'broken' is not a real method
    rc = main(["--suite", "smoke", "--method", "topk", "broken", "--backend", "sequential", "--out", str(tmp_path)], runner=FakeRunner())
    assert rc == 1
    out = capsys.readouterr().out
    assert "failed  smoke/ppo-broken-crl-s0" in out and "sweep: 1/2 trials complete" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--suite", "smoke", "--method", "topkk"], "unknown method 'topkk'; valid choices: topk,"),
        (["--suite", "smok", "--method", "topk"], "unknown suite 'smok'; valid choices: cw10"),
        (["--suite", "smoke", "--method", "topk", "--algo", "sac"], "unknown algo 'sac'; valid choices: ppo, td3"),
        (["--suite", "smoke", "--method", "topk", "--protocol", "both"], "unknown protocol 'both'; valid choices: crl, rl"),
        (["--suite", "smoke", "--method", "topk", "--backend", "dask"], "unknown backend 'dask'; valid choices: auto, ray, local, sequential"),
        (["--suite", "smoke", "--method", "topk", "--parallel", "0"], "--parallel must be >= 1, got 0"),
        (["--suite", "smoke", "--method", "topk", "--backend", "sequential", "--parallel", "2"], "--parallel 2 needs the local backend"),
        (["--suite", "smoke", "--method", "topk", "--backend", "local", "--gpus-per-trial", "0.5"], "--gpus-per-trial 0.5 needs a visible CUDA device"),
        (["--suite", "smoke", "--method", "topk", "--seed", "1", "1"], "duplicate seeds"),
        (["--suite", "smoke", "--method", "topk", "--cpus-per-trial", "0"], "--cpus-per-trial must be > 0"),
        (["--suite", "smoke", "--method", "topk", "--backend", "sequential", "--address", "auto"], "--address 'auto' needs the ray backend"),
        (["--suite", "smoke", "--method", "topk", "--backend", "local", "--address", "auto"], "valid choices with it: auto, ray"),
        (["--suite", "smoke"], "the following arguments are required: --method"),
        (["--suite", "smoke", "--method", "topk", "--", "--set", "foo.bar=1"], "unknown --set key 'foo.bar'"),
    ],
)
def test_bad_input_exit_2_and_nothing_written(
    args: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(sweep.backends, "visible_gpus", lambda: 0)
    runner = FakeRunner()
    assert main(["--out", str(tmp_path / "runs"), *args], runner=runner) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not runner.calls and not (tmp_path / "runs").exists()


def test_local_backend_runs_trials_side_by_side(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    runner = SlowRunner(0.3)
    sweep_run.ray_available()  # its first ``import ray`` (0.7 s on a busy machine) is not what this times
    start = time.monotonic()
    args = ["--suite", "smoke", "--method", "topk", "--seed", "0", "1", "2", "3", "--backend", "local", "--parallel", "2"]
    assert main([*args, "--out", str(tmp_path)], runner=runner) == 0
    elapsed = time.monotonic() - start
    assert runner.most == 2 and elapsed < 0.8 * 4 * 0.3  # two at a time, never three
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "running 2 trials at a time on this machine"
    reported = [line.split()[2] for line in out.splitlines() if line.startswith("[")]
    assert sorted(reported) == [f"smoke/ppo-topk-crl-s{seed}" for seed in range(4)]  # each trial once
    manifest = json.loads((tmp_path / "sweep.json").read_text())
    assert [t["status"] for t in manifest["trials"]] == ["done"] * 4
    assert manifest["config"]["parallel"] == 2 and manifest["throughput"]["env_steps"] == 4 * 3 * 10  # smoke: 3 tasks of 10 steps


@pytest.mark.parametrize(
    ("cfg", "num_cpus", "n_gpus", "slots"),
    [
        ({"cpus_per_trial": 2}, 16, 0, 8),
        ({"cpus_per_trial": 3}, 16, 0, 5),
        ({"cpus_per_trial": 4}, 2, 0, 1),  # at least one
        ({"gpus_per_trial": 0.125}, 16, 1, 8),
        ({"gpus_per_trial": 0.1}, 16, 1, 10),  # not 9: 1 // 0.1 == 9.0
        ({"cpus_per_trial": 2, "gpus_per_trial": 0.125}, 8, 1, 4),  # the CPUs hold fewer
        ({"gpus_per_trial": 0.5}, 16, 1, 2),  # the GPU holds fewer
        ({"gpus_per_trial": 0.5}, 16, 2, 4),
        ({"parallel": 3, "cpus_per_trial": 2, "gpus_per_trial": 0.5}, 2, 1, 3),  # explicit wins
    ],
)
def test_local_slots(cfg: dict, num_cpus: int, n_gpus: int, slots: int) -> None:
    assert local_slots(SweepConfig(suites=("smoke",), methods=("topk",), **cfg), num_cpus, n_gpus) == slots


@pytest.mark.parametrize(
    ("cfg", "n_gpus", "message"),
    [
        ({"parallel": 0}, 0, "--parallel must be >= 1, got 0"),
        ({"parallel": -2}, 1, "--parallel must be >= 1, got -2"),
        ({"gpus_per_trial": 0.25}, 0, "--gpus-per-trial 0.25 needs a visible CUDA device"),
        ({"gpus_per_trial": 0.25, "parallel": 2}, 0, "--gpus-per-trial 0.25 needs a visible CUDA device"),
    ],
)
def test_local_slots_bad_values(cfg: dict, n_gpus: int, message: str) -> None:
    with pytest.raises(SweepError, match="^" + message.replace(".", r"\.").replace("-", r"\-")) as info:
        local_slots(SweepConfig(suites=("smoke",), methods=("topk",), **cfg), 16, n_gpus)
    assert "\n" not in str(info.value)


def test_local_backend_spreads_trials_over_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(sweep.backends, "visible_gpus", lambda: 2)
    cfg = SweepConfig(suites=("smoke",), methods=("topk",), seeds=tuple(range(5)), out=tmp_path / "two", gpus_per_trial=0.5)
    runner = SlowRunner(0.2)
    run_sweep(cfg, "local", runner, RayOptions(num_cpus=2))  # 2 slots (the CPUs hold fewer than the GPUs' 4)
    assert runner.most == 2 and Counter(gpu for _, _, gpu in runner.spans).keys() == {"0", "1"}
    for i, (start, end, gpu) in enumerate(runner.spans):  # trials running at once are on different GPUs
        assert all(gpu != other for s, e, other in runner.spans[i + 1 :] if s < end and start < e)
    # the GPUs this process sees are the ones handed out
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    runner = SlowRunner(0.05)
    run_sweep(replace(cfg, out=tmp_path / "five-seven"), "local", runner, RayOptions(num_cpus=2))
    assert {gpu for _, _, gpu in runner.spans} == {"5", "7"}
    # one GPU: shared by every trial, the environment left as is
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(sweep.backends, "visible_gpus", lambda: 1)
    runner = SlowRunner(0.05)
    run_sweep(replace(cfg, out=tmp_path / "one"), "local", runner, RayOptions(num_cpus=2))
    assert runner.most == 2 and {gpu for _, _, gpu in runner.spans} == {None}


def test_auto_without_ray_uses_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweep_run, "ray_available", lambda: False)
    assert sweep.resolve_backend("auto", SweepConfig(suites=("smoke",), methods=("topk",))) == "local"
    runner = SlowRunner(0.2)
    assert main(["--suite", "smoke", "--method", "topk", "--seed", "0", "1", "--num-cpus", "2", "--out", str(tmp_path)], runner=runner) == 0
    assert runner.most == 2


def test_ctrl_c_cancels_pending_trials(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Ctrl-C while two of four trials run: main reports the interrupt and the other two never start."""

    class Interrupting(SlowRunner):
        def __call__(self, trial: Trial, command: list[str], env: dict[str, str]) -> Outcome:
            if trial.seed == 0:  # what the terminal does on Ctrl-C: SIGINT to the sweep (and its children)
                time.sleep(0.05)  # the sweep is waiting on its trials
                self.interrupted = time.monotonic()
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
            return super().__call__(trial, command, env)

    runner = Interrupting(0.3)
    args = ["--suite", "smoke", "--method", "topk", "--seed", "0", "1", "2", "3", "--backend", "local", "--parallel", "2"]
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job starts with SIGINT ignored
    try:
        assert main([*args, "--out", str(tmp_path)], runner=runner) == 130
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - runner.interrupted < 0.2  # main did not wait for the running trials
    assert "interrupted; re-run the same command to resume" in capsys.readouterr().err
    time.sleep(0.5)  # the running trials end; cancelled ones must not start
    assert 0 in runner.started and set(runner.started) <= {0, 1}


def test_dry_run_prints_commands(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--suite", "smoke", "--method", "topk", "--seed", "0", "1", "--out", str(tmp_path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("-m rl_moe.crl") == 2 and "ppo-topk-crl-s1: to run" in out
    assert not any(tmp_path.iterdir())


def test_ray_backend_runs_trials(tmp_path: Path) -> None:
    """Two real smoke-suite trials as Ray tasks on a local cluster, then a resume that skips both."""
    pytest.importorskip("ray")
    out = tmp_path / "runs"
    args = ["--suite", "smoke", "--method", "topk", "--protocol", "crl", "rl", "--out", str(out), "--backend", "ray", "--num-cpus", "2"]
    assert main(args + TINY) == 0
    for name in ("ppo-topk-crl-s0", "ppo-topk-rl-s0"):
        assert is_complete(out / "smoke" / name)
        assert (out / "smoke" / name / "sweep.log").read_text().startswith("$ ")
    runner = FakeRunner()
    outcomes = run_sweep(SweepConfig(suites=("smoke",), methods=("topk",), protocols=("crl", "rl"), out=out, crl_args=("--tasks", "2")), "ray", runner)
    assert [o.status for o in outcomes] == ["skipped", "skipped"] and not runner.calls


def niceness_runner(trial: Trial, command: list[str], env: dict[str, str]) -> Outcome:
    """A trial runner for Ray (a function): writes a complete results.json and the niceness the trial ran at."""
    outcome = FakeRunner()(trial, command, env)
    (trial.run_dir / "niceness").write_text(str(os.nice(0)))
    return outcome


def test_ray_trials_run_at_the_sweeps_own_priority(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's workers raise their niceness by 15: beside two training runs a smoke sweep took 6.9x the
    local backend's time. A cluster the sweep starts runs its trials at the sweep's own niceness."""
    ray = pytest.importorskip("ray")
    if os.nice(0) >= 19:
        pytest.skip("at niceness 19 Ray's default and ours are the same")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray's workers cannot import the tests
    monkeypatch.delenv(backends.RAY_WORKER_NICENESS, raising=False)
    cfg = SweepConfig(suites=("smoke",), methods=("topk",), seeds=(0, 1), out=tmp_path)
    outcomes = run_sweep(cfg, "ray", niceness_runner, RayOptions(num_cpus=2))
    assert [o.status for o in outcomes] == ["done", "done"]
    assert [int((o.trial.run_dir / "niceness").read_text()) for o in outcomes] == [os.nice(0)] * 2
    assert backends.RAY_WORKER_NICENESS not in os.environ


@pytest.mark.parametrize("user_setting", [None, "3"])
@pytest.mark.parametrize("start_fails", [False, True])
def test_ray_niceness_reaches_only_the_start_and_a_users_value_is_kept(
    monkeypatch: pytest.MonkeyPatch, user_setting: str | None, start_fails: bool
) -> None:
    """What the raylet would see at ``ray.init`` (a fake one here), and ``os.environ`` afterwards."""
    ray = pytest.importorskip("ray")
    if user_setting is None:
        monkeypatch.delenv(backends.RAY_WORKER_NICENESS, raising=False)
    else:
        monkeypatch.setenv(backends.RAY_WORKER_NICENESS, user_setting)
    seen: list[str | None] = []

    def init(**kwargs: object) -> None:
        seen.append(os.environ.get(backends.RAY_WORKER_NICENESS))
        if start_fails:
            raise RuntimeError("could not start")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "remote", lambda **kw: (_ for _ in ()).throw(RuntimeError("stop here")))
    shutdowns: list[bool] = []
    monkeypatch.setattr(ray, "shutdown", lambda: shutdowns.append(True))
    cfg = SweepConfig(suites=("smoke",), methods=("topk",))
    with pytest.raises(RuntimeError, match="could not start" if start_fails else "stop here"):
        list(backends.run_ray([], {}, FakeRunner(), cfg, RayOptions(num_cpus=1)))
    assert seen == [user_setting or "0"]
    assert os.environ.get(backends.RAY_WORKER_NICENESS) == user_setting
    assert shutdowns == ([] if start_fails else [True])  # a cluster started here goes down with the sweep


def test_sequential_real_cli_then_report(tmp_path: Path) -> None:
    """One real trial through the CLI subprocess (the path without Ray), then the report on its folder."""
    out = tmp_path / "runs"
    args = ["--suite", "smoke", "--method", "topk", "--out", str(out), "--backend", "sequential"]
    assert main(args + TINY) == 0
    results = json.loads((out / "smoke" / "ppo-topk-crl-s0" / "results.json").read_text())
    assert results["complete"] and results["tasks"] == ["pendulum-0", "pendulum-1"] and results["steps_per_task"] == 128
    manifest = json.loads((out / "sweep.json").read_text())
    trained = sum(end - start for start, end in results["task_segments"])
    assert trained >= 256 and manifest["trials"][0]["env_steps"] == trained == manifest["throughput"]["env_steps"]
    report = subprocess.run(
        [sys.executable, "-m", "rl_moe.report", str(out), "--out", str(tmp_path / "rep"), "--reps", "200"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr
    md = (tmp_path / "rep" / "report.md").read_text()
    assert f"| pendulum-0 | {results['own_success'][0]:.2f} |" in md  # one seed: the mean alone
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "rep" / "plasticity-entk_rank_smoke_ppo_crl.png").read_bytes()[:4] == b"\x89PNG"
    # A finished trial kept without its checkpoints (19 MB each on CW10) is still skipped, not refused.
    shutil.rmtree(out / "smoke" / "ppo-topk-crl-s0" / "checkpoints")
    assert main(args + TINY) == 0
    assert json.loads((out / "smoke" / "ppo-topk-crl-s0" / "results.json").read_text()) == results


def test_local_real_cli_two_trials_side_by_side(tmp_path: Path) -> None:
    """Two real trials through the CLI subprocess at once (the path without Ray), then a resume that skips both."""
    out = tmp_path / "runs"
    args = ["--suite", "smoke", "--method", "topk", "--protocol", "crl", "rl", "--out", str(out), "--backend", "local", "--parallel", "2"]
    assert main(args + TINY) == 0
    for name in ("ppo-topk-crl-s0", "ppo-topk-rl-s0"):
        assert is_complete(out / "smoke" / name)
        assert (out / "smoke" / name / "sweep.log").read_text().count("$ ") == 1  # its own log only
    manifest = json.loads((out / "sweep.json").read_text())
    rows, throughput = manifest["trials"], manifest["throughput"]
    assert sum(r["seconds"] for r in rows) > 1.2 * throughput["seconds"]  # they overlapped
    assert throughput["env_steps"] == sum(r["env_steps"] for r in rows) >= 2 * 256
    runner = FakeRunner()
    outcomes = run_sweep(SweepConfig(suites=("smoke",), methods=("topk",), protocols=("crl", "rl"), out=out, crl_args=("--tasks", "2")), "local", runner)
    assert [o.status for o in outcomes] == ["skipped", "skipped"] and not runner.calls


def test_progress_line_counts_trials_steps_and_eta(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    from rl_moe.continual.resolve import RunRequest, resolve
    from rl_moe.runlock import RunLock
    from rl_moe.sweep.progress import line, snapshot

    cfg = SweepConfig(suites=("smoke",), methods=("topk",), seeds=(0, 1, 2), out=tmp_path)
    done, running, queued = grid(cfg)
    run_cfg = resolve(RunRequest(suite="smoke", method="topk", tasks=2, steps_per_task=1024, device="cpu"))
    assert len(run_cfg.tasks) * run_cfg.effective_steps_per_task == 2048
    for t in (done, running):
        t.run_dir.mkdir(parents=True)
        run_cfg.save(str(t.run_dir / "config.json"))
    with SummaryWriter(str(running.run_dir / "tb")) as w:
        for step in (256, 512):
            w.add_scalar("time/fps", 100.0, step)
    lock = RunLock(running.run_dir).acquire()
    try:
        snap = snapshot([done, running, queued], {done.run_dir}, before={})
    finally:
        lock.release()
    # The unstarted trial is assumed to need the mean known budget (2048).
    assert snap == (1, 1, 1, 512, (2048 - 512) + 2048)
    assert line(snap, 10.0) == "sweep: 1 done, 1 running, 1 queued; 512 env steps in 0:00:10, 51 env steps/s; ETA 0:01:10"


def test_progress_of_a_resumed_trial_counts_from_its_finished_tasks(tmp_path: Path) -> None:
    # An interrupted attempt logged up to step 1,536 in task 2; the resumed run restarts task 2 at
    # 1,024 and has reached 1,280, so this sweep trained 256 steps (not 0, as when counting from
    # the interrupted attempt's last step).
    from torch.utils.tensorboard import SummaryWriter

    from rl_moe.sweep.progress import Heartbeat, TrialStates, snapshot

    cfg = SweepConfig(suites=("smoke",), methods=("topk",), out=tmp_path)
    (trial,) = grid(cfg)
    trial.run_dir.mkdir(parents=True)
    (trial.run_dir / "results.json").write_text(json.dumps({"task_segments": [[0, 1024]]}))
    with SummaryWriter(str(trial.run_dir / "tb"), filename_suffix=".a") as w:
        for step in (512, 1024, 1280, 1536):
            w.add_scalar("time/fps", 100.0, step)
    heartbeat = Heartbeat([trial], TrialStates(), every=60.0)
    heartbeat.__enter__()
    heartbeat.__exit__()
    assert heartbeat.before == {trial.run_dir: 1024}
    time.sleep(1.1)  # the resumed writer's file sorts after the first (its name holds the time)
    with SummaryWriter(str(trial.run_dir / "tb"), filename_suffix=".b") as w:
        for step in (1152, 1280):
            w.add_scalar("time/fps", 100.0, step)
    assert snapshot([trial], set(), heartbeat.before).steps == 256


@pytest.mark.parametrize("backend", ["sequential", "local"])
def test_a_trial_stopped_by_ctrl_c_stops_the_sweep(tmp_path: Path, backend: str) -> None:
    # Ctrl-C reaches the whole process group: a trial can exit 130 before the sweep sees the
    # signal, and its freed slot must not start the next trial.
    ran: list[int] = []

    def runner(trial: Trial, command: list[str], env: dict[str, str]) -> Outcome:
        ran.append(trial.seed)
        return Outcome(trial, "failed", 130)

    cfg = SweepConfig(suites=("smoke",), methods=("topk",), seeds=(0, 1, 2), out=tmp_path, parallel=1 if backend == "local" else None)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(cfg, backend, runner, RayOptions(num_cpus=1))
    assert ran == [0]


def test_progress_lines_count_launched_trials_as_running_and_returned_ones_as_done(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A trial runs from its launch, before its CLI takes the folder's lock (none here: the fake
    runner never takes one), and is done as soon as it returns."""
    cfg = SweepConfig(suites=("smoke",), methods=("topk",), seeds=(0, 1), out=tmp_path)
    runner = SlowRunner(seconds=1.0)
    run_sweep(cfg, "local", runner, RayOptions(num_cpus=2), progress_every=0.25)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("sweep: ") and "running" in ln]
    assert lines, "no progress line"
    counts = [tuple(int(n) for n in re.search(r"(\d+) done, (\d+) running, (\d+) queued", ln).groups()) for ln in lines]
    # Both trials start at once: never queued, and each is running or done from its launch on.
    assert all(queued == 0 and done + running == 2 for done, running, queued in counts), lines
    assert any(running == 2 for _, running, _ in counts), lines


def test_a_finished_shorter_run_is_continued_not_skipped(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # The CRL slice (--tasks 2 here) then the whole suite in the same folders: the sweep continues
    # each finished slice with --tasks 3, and a trial already holding 3 tasks is skipped.
    cfg = SweepConfig(suites=("smoke",), methods=("topk",), seeds=(0, 1), out=tmp_path, crl_args=("--tasks", "2"))
    run_sweep(cfg, "sequential", FakeRunner())
    assert all(is_complete(t.run_dir, 2) and not is_complete(t.run_dir, 3) for t in grid(cfg))
    whole = replace(cfg, crl_args=())
    assert [trial_command(t, whole)[-2:] for t in grid(whole)] == [["--tasks", "3"]] * 2
    runner = FakeRunner()
    outcomes = run_sweep(whole, "sequential", runner)
    assert [o.status for o in outcomes] == ["done", "done"] and all(json.loads((t.run_dir / "results.json").read_text())["tasks"] == ["t0", "t1", "t2"] for t in grid(whole))
    assert [o.status for o in run_sweep(whole, "sequential", FakeRunner())] == ["skipped", "skipped"]
    assert all("--tasks" not in trial_command(t, whole) for t in grid(whole))  # nothing left to extend


def test_trials_start_seed_by_seed_so_methods_have_equal_seed_counts_at_every_stop(tmp_path: Path) -> None:
    cfg = SweepConfig(suites=("smoke",), methods=("topk", "sphere"), seeds=(0, 1, 2), out=tmp_path)
    assert [(t.method, t.seed) for t in grid(cfg)] == [("topk", 0), ("sphere", 0), ("topk", 1), ("sphere", 1), ("topk", 2), ("sphere", 2)]
    runner = SlowRunner(0.05)
    run_sweep(replace(cfg, parallel=2), "local", runner)
    assert runner.started == [0, 0, 1, 1, 2, 2]


def test_a_method_variant_has_its_own_arguments_and_folder(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    variant = "lossratio=sphere --set reg.sphere.coef_mode=loss_ratio --set reg.sphere.rho=0.05"
    cfg = SweepConfig(suites=("smoke",), methods=("sphere", variant), seeds=(0,), out=tmp_path, crl_args=("--set", "reg.sphere.rho=0.3"))
    plain, lossratio = grid(cfg)
    assert (plain.run_dir.name, lossratio.run_dir.name) == ("ppo-sphere-crl-s0", "ppo-lossratio-crl-s0")
    assert lossratio.method == "sphere"
    cmd = trial_command(lossratio, cfg)
    # the variant's own arguments come last, so its --set wins over the one every trial gets
    assert cmd[-6:] == ["--set", "reg.sphere.rho=0.3", "--set", "reg.sphere.coef_mode=loss_ratio", "--set", "reg.sphere.rho=0.05"]
    assert "reg.sphere.coef_mode=loss_ratio" not in trial_command(plain, cfg)
    (own,) = grid(replace(cfg, methods=("sphere --preset sb3",)))
    assert own.run_dir.name == "ppo-sphere-crl-s0" and trial_command(own, cfg)[-2:] == ["--preset", "sb3"]
    base = ["--suite", "smoke", "--out", str(tmp_path / "bad"), "--dry-run", "--method"]
    for methods, message in (
        (["sphere", "sphere"], "names sphere more than once"),
        (["a/b=sphere"], "LABEL a plain word"),
        (["sphere", "sphere --set reg.sphere.rho=0.05"], "names sphere more than once"),
        (["x=sphere --set reg.sphere.not_a_field=1"], "not_a_field"),
        (["x=nosuchmethod"], "nosuchmethod"),
    ):
        assert main([*base, *methods]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "bad").exists()


def _sweep(out: Path, *extra: str) -> subprocess.Popen:
    """The sweep as a user starts it: its own process group, so a kill takes its trials too."""
    argv = ["--suite", "smoke", "--method", "topk", "sphere", "--seed", "0", "--backend", "local", "--parallel", "2", "--out", str(out),
            "--progress-every", "0", *extra, *SLICE]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "rl_moe.sweep", *argv], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)


# two 1,024-step tasks of 128-step rollouts, an in-task checkpoint every 256 steps
SLICE = ["--steps-per-task", "1024", "--tasks", "2", "--", "--preset", "tiny", "--set", "checkpoint.every_steps=256"]


def test_a_sweep_killed_mid_trial_and_run_again_equals_an_uninterrupted_one(tmp_path: Path) -> None:
    """The campaign's interruption: the sweep and its trials killed (SIGKILL to the process group)
    once each trial has an in-task checkpoint, then the same command again. Every trial resumes
    inside its task and ends bit for bit where an uninterrupted sweep does, its held-out scores
    included."""
    from rl_moe.fingerprint import fingerprint

    whole = _sweep(tmp_path / "whole", "--heldout", "2", "--experts")
    assert whole.wait(timeout=600) == 0, whole.stderr.read() if whole.stderr else ""
    cut = tmp_path / "cut"
    proc = _sweep(cut, "--heldout", "2", "--experts")
    names = ("ppo-topk-crl-s0", "ppo-sphere-crl-s0")
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        if all(RunDir(cut / "smoke" / n).in_task.is_file() for n in names):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the sweep ended before both trials wrote an in-task checkpoint"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    partial = {n: json.loads((cut / "smoke" / n / "results.json").read_text()) for n in names}
    assert not any(r["complete"] for r in partial.values())
    again = _sweep(cut, "--heldout", "2", "--experts")
    assert again.wait(timeout=600) == 0, again.stderr.read() if again.stderr else ""
    for n in names:
        a, b = tmp_path / "whole" / "smoke" / n, cut / "smoke" / n
        assert fingerprint(b) == fingerprint(a), n
        stretches = json.loads((b / "results.json").read_text())["provenance"]
        starts = [seg[0] for seg in json.loads((b / "results.json").read_text())["task_segments"]]
        assert any(s["from_step"] not in starts for s in stretches), stretches  # resumed inside a task, not restarted
        score = lambda p: {k: v for k, v in json.loads((p / "positions-2.json").read_text()).items() if k in ("own_success_heldout", "own_success_train")}  # noqa: E731
        assert score(b) == score(a) and "own_success_heldout" in score(a)
        assert (b / "sweep.log").read_text().count("rl_moe.positions") == 1 and (b / "sweep.log").read_text().count("rl_moe.experts") == 1
        usage = lambda p: {k: v for k, v in json.loads((p / "experts.json").read_text()).items() if k != "scored_by"}  # noqa: E731
        assert usage(b) == usage(a) and len(usage(a)["shares"]) == 2
    # finished and scored: the same command again has nothing to do
    last = _sweep(cut, "--heldout", "2", "--experts")
    assert last.wait(timeout=120) == 0
