"""``--vec-env auto``: each task trains on the backend measured fastest at its start
(:mod:`rl_moe.envs.backend_choice`), records the choice, and keeps it on a rerun."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from stable_baselines3.common.save_util import load_from_zip_file

from rl_moe.continual.scheduler import ContinualScheduler
from rl_moe.crl import main
from rl_moe.envs import backend_choice, envpool_env
from rl_moe.envs.backend_choice import OFFICIAL, BackendChoice, Candidate, candidates, measure_rates, pick, recorded_backend
from rl_moe.envs.factories import task_factories
from rl_moe.envs.suites import load_suite
from rl_moe.rundir import RunDir
from tests.conftest import CLI_TINY, needs_envpool

CW = load_suite("cw10-cw")  # positions resampled: EnvPool serves 7 of its 10 tasks
PAPER = load_suite("cw10-paper")  # fixed positions: the official envs only


def _factories(suite, name: str, n: int = 2):
    return task_factories(suite, next(t for t in suite.tasks if t.name == name), n, 0)


def test_pick_takes_the_fastest_and_the_official_envs_on_a_tie() -> None:
    pool2, pool1 = Candidate("envpool", 2), Candidate("envpool", 1)
    assert pick({OFFICIAL: 500.0, pool2: 2000.0, pool1: 1500.0}) == pool2
    assert pick({OFFICIAL: 900.0, pool2: 300.0, pool1: 600.0}) == OFFICIAL  # a busy machine
    assert pick({OFFICIAL: 700.0, pool2: 700.0}) == OFFICIAL


def test_candidates_are_the_backends_that_serve_the_task_faithfully(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(envpool_env, "envpool_installed", lambda: True)
    labels = lambda fs, w: [c.label for c in candidates(fs, w)]  # noqa: E731
    assert labels(_factories(CW, "push-wall-v3", 8), 2) == ["dummy", "envpool/2", "envpool/1"]
    assert labels(_factories(CW, "push-wall-v3", 8), 1) == ["dummy", "envpool/1"]
    assert labels(_factories(CW, "push-wall-v3", 1), 4) == ["dummy", "envpool/1"]  # at most one worker per env
    assert labels(_factories(CW, "hammer-v3", 8), 2) == ["dummy"]  # EnvPool's hammer differs from the official one
    assert labels(_factories(PAPER, "push-wall-v3", 8), 2) == ["dummy"]  # EnvPool cannot keep positions fixed
    monkeypatch.setattr(envpool_env, "envpool_installed", lambda: False)
    assert labels(_factories(CW, "push-wall-v3", 8), 2) == ["dummy"]


def test_a_rerun_keeps_the_backend_its_task_last_ran_on() -> None:
    provenance = [
        {"task": 0, "backend": "dummy+fast", "pool_workers": 0},
        {"task": 1, "backend": "envpool", "pool_workers": 2, "backend_rates": {"dummy": 400.0, "envpool/2": 2000.0}},
        {"task": 1, "backend": "envpool", "pool_workers": 1},  # resumed inside the task
    ]
    assert recorded_backend(provenance, 0, 2) == BackendChoice(OFFICIAL)
    assert recorded_backend(provenance, 1, 2) == BackendChoice(Candidate("envpool", 1))
    assert recorded_backend(provenance[:2], 1, 2) == BackendChoice(Candidate("envpool", 2))
    assert recorded_backend(provenance[:2], 1, 1) == BackendChoice(Candidate("envpool", 1))  # within this session's --threads
    assert recorded_backend(provenance, 2, 2) is None


def test_the_record_and_the_note_name_the_measured_rates() -> None:
    choice = BackendChoice(Candidate("envpool", 2), {"dummy": 480.4, "envpool/2": 2150.0, "envpool/1": 1700.26}, 4.567)
    assert choice.record() == {"pool_workers": 2, "backend_rates": {"dummy": 480.4, "envpool/2": 2150.0, "envpool/1": 1700.3}, "backend_seconds": 4.57}
    assert choice.note("push-wall-v3") == "note: push-wall-v3 trains on envpool/2: 2,150 env steps/s measured here (against dummy 480, envpool/1 1,700)"
    assert BackendChoice(OFFICIAL).note("hammer-v3") is None and BackendChoice(OFFICIAL).record() == {"pool_workers": 0}


@needs_envpool
def test_measured_rates_are_real_env_steps_per_second() -> None:
    fs = _factories(CW, "push-wall-v3", 2)
    cands = candidates(fs, 2)
    rates = measure_rates(fs, cands, vec_steps=8, rounds=1)
    assert list(rates) == cands and all(0 < r < 1e6 for r in rates.values())


#: hammer (EnvPool does not serve it: no measurement) then push-wall (measured), tiny networks.
ARGV = ["--suite", "cw10-cw", "--method", "topk", "--tasks", "2", "--steps-per-task", "128", *CLI_TINY, "--set", "eval.n_episodes=2", "--set", "eval.matrix_episodes=2"]


def _weights(run: Path, task: int) -> dict[str, torch.Tensor]:
    ckpt = RunDir(run).checkpoint(task, CW.tasks[task].name)
    return load_from_zip_file(str(ckpt))[1]["policy"]


@needs_envpool
def test_an_auto_run_records_each_task_s_choice_and_trains_as_the_chosen_backend(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """hammer (no pool: no measurement) then push-wall (measured). When the measurement picks the
    official envs, training is bit for bit a ``--vec-env dummy`` run's."""
    argv = ARGV
    monkeypatch.setattr(backend_choice, "pick", lambda rates: OFFICIAL)
    auto = tmp_path / "auto"
    assert main([*argv, "--run-dir", str(auto), "--vec-env", "auto"]) == 0
    assert json.loads((auto / "config.json").read_text())["vec_env"] == "auto"
    prov = json.loads((auto / "results.json").read_text())["provenance"]
    assert prov[0]["backend"] == "dummy+fast" and "backend_rates" not in prov[0]
    assert prov[1]["backend"] == "dummy+fast" and prov[1]["pool_workers"] == 0
    assert set(prov[1]["backend_rates"]) <= {"dummy", "envpool/1", "envpool/2"} and {"dummy", "envpool/1"} <= set(prov[1]["backend_rates"])
    assert "note: push-wall-v3 trains on dummy: " in capsys.readouterr().err
    dummy = tmp_path / "dummy"
    assert main([*argv, "--run-dir", str(dummy), "--vec-env", "dummy"]) == 0
    for task in (0, 1):
        a, d = _weights(auto, task), _weights(dummy, task)
        assert a.keys() == d.keys() and all(torch.equal(a[k], d[k]) for k in a)
    assert main(["--resume", str(auto), "--vec-env", "dummy"]) == 2
    assert "--vec-env dummy conflicts with the resumed run's stored 'auto'" in capsys.readouterr().err


@needs_envpool
def test_a_task_trains_on_the_pool_it_picked_and_a_rerun_keeps_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Interrupted inside push-wall after it picked EnvPool with one worker; resumed where the
    measurement would now pick the official envs, the task still trains on the pool."""
    run = tmp_path / "run"
    monkeypatch.setattr(backend_choice, "pick", lambda rates: Candidate("envpool", 1))
    learn = ContinualScheduler._learn

    def interrupted(self, i, steps, hooks):  # type: ignore[no-untyped-def]
        if i == 1:
            raise KeyboardInterrupt
        return learn(self, i, steps, hooks)

    monkeypatch.setattr(ContinualScheduler, "_learn", interrupted)
    assert main([*ARGV, "--run-dir", str(run), "--vec-env", "auto"]) != 0
    prov = json.loads((run / "results.json").read_text())["provenance"]
    assert prov[-1]["task"] == 1 and prov[-1]["backend"] == "envpool" and prov[-1]["pool_workers"] == 1 and "backend_rates" in prov[-1]
    monkeypatch.setattr(backend_choice, "pick", lambda rates: OFFICIAL)
    monkeypatch.setattr(ContinualScheduler, "_learn", learn)
    assert main(["--resume", str(run)]) == 0
    res = json.loads((run / "results.json").read_text())
    assert res["complete"] and res["provenance"][-1]["task"] == 1
    assert res["provenance"][-1]["backend"] == "envpool" and "backend_rates" not in res["provenance"][-1]


@needs_envpool
def test_the_pool_s_worker_count_does_not_change_what_evaluation_sees() -> None:
    """Under auto, evaluation runs on the pool with the training task's workers (1 or the run's):
    the same seeds give the same episodes either way."""
    import numpy as np

    from rl_moe.envs.factories import make_vec_env

    fs = _factories(CW, "push-wall-v3", 4)
    one, two = make_vec_env(fs, "envpool", 1), make_vec_env(fs, "envpool", 2)
    try:
        rng = np.random.default_rng(0)
        assert np.array_equal(one.reset(), two.reset())
        for _ in range(30):
            a = rng.uniform(-1, 1, size=(4, 4)).astype(np.float32)
            (o1, r1, d1, _), (o2, r2, d2, _) = one.step(a), two.step(a)
            assert np.array_equal(o1, o2) and np.array_equal(r1, r2) and np.array_equal(d1, d2)
    finally:
        one.close()
        two.close()


def test_resuming_an_auto_run_without_envpool_is_refused_only_where_the_pool_serves_a_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rl_moe.continual.resolve import RunRequest, resolve
    from rl_moe.continual.resume import check_resumable
    from rl_moe.errors import MissingDependencyError

    monkeypatch.setattr(envpool_env, "envpool_installed", lambda: True)  # as where the run began
    cfgs = {(suite, n): resolve(RunRequest(suite=suite, method="topk", tasks=n, vec_env="auto")) for suite, n in (("cw10-cw", 1), ("cw10-cw", 2), ("cw10-paper", 3))}
    assert all(c.vec_env == "auto" for c in cfgs.values())
    monkeypatch.setattr(envpool_env, "envpool_installed", lambda: False)
    with pytest.raises(MissingDependencyError, match="envpool .auto., which is not installed"):
        check_resumable(tmp_path, cfgs["cw10-cw", 2])  # push-wall: the pool serves it
    check_resumable(tmp_path, cfgs["cw10-cw", 1])  # hammer alone: the official envs anyway
    check_resumable(tmp_path, cfgs["cw10-paper", 3])  # fixed positions: the official envs anyway


@pytest.mark.parametrize(("suite", "tasks", "expected"), [("cw10-paper", 3, 1), ("cw10-cw", 2, 2)])
def test_an_auto_run_starts_on_the_threads_of_the_backends_its_tasks_can_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suite: str, tasks: int, expected: int) -> None:
    # Two torch threads only where the pool may serve one of the run's tasks (push-wall under the
    # Continual World rules); the paper's fixed positions keep every task on the official envs.
    from rl_moe.envs import threads

    class Started(Exception):
        pass

    seen: list[int] = []

    def first_setting(n: int) -> None:
        seen.append(n)
        raise Started

    monkeypatch.setattr(envpool_env, "envpool_installed", lambda: True)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    monkeypatch.setattr(threads, "busy_cores", lambda: 0.0)  # two free cores: the pool would get 2
    monkeypatch.setattr(torch, "set_num_threads", first_setting)
    with pytest.raises(Started):
        main(["--suite", suite, "--tasks", str(tasks), "--vec-env", "auto", "--run-dir", str(tmp_path / "run"), "--no-progress", *CLI_TINY])
    assert seen == [expected]
