"""Provenance (rl_moe.provenance): the commit and dirty flag of the code, and the env backend each
stretch of training stepped on, as written into config.json and results.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from stable_baselines3.common.vec_env import VecNormalize

from rl_moe import provenance
from rl_moe.continual.resolve import RunRequest, resolve, suite_of
from rl_moe.envs.factories import make_vec_env, task_factories
from rl_moe.envs.families import METAWORLD_FAST_VAR


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def test_code_version_names_the_commit_and_whether_tracked_files_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    _git(repo, "add", "a.py")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    monkeypatch.setattr(provenance, "_ROOT", repo)
    head = _git(repo, "rev-parse", "HEAD")
    assert provenance.code_version() == {"commit": head, "dirty": False}
    (repo / "runs").mkdir()
    (repo / "runs" / "new.json").write_text("{}")  # untracked: a run folder does not make it dirty
    assert provenance.code_version() == {"commit": head, "dirty": False}
    (repo / "a.py").write_text("x = 2\n")
    assert provenance.code_version() == {"commit": head, "dirty": True}
    monkeypatch.setattr(provenance, "_ROOT", tmp_path / "not-a-repo")
    assert provenance.code_version() == {"commit": None, "dirty": None}


@pytest.mark.parametrize("fast", ["1", "0"])
def test_the_backend_says_whether_metaworld_ran_on_the_fast_path(fast: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(METAWORLD_FAST_VAR, fast)
    suite = suite_of(resolve(RunRequest(suite="cw10", method="topk", tasks=1, vec_env="dummy")))
    env = make_vec_env(task_factories(suite, suite.tasks[2], 2, 0), "dummy")
    want = "dummy+fast" if fast == "1" else "dummy"
    assert provenance.vec_env_backend(env, "metaworld") == want
    assert provenance.vec_env_backend(VecNormalize(env), "metaworld") == want
    # in-process envs answer for themselves: a family registered under another name that builds
    # MetaWorld envs records the fast path too
    assert provenance.vec_env_backend(env, "my-metaworld") == want
    env.close()
    smoke = suite_of(resolve(RunRequest(suite="smoke", method="topk", tasks=1, vec_env="dummy")))
    assert provenance.vec_env_backend(make_vec_env(task_factories(smoke, smoke.tasks[0], 2, 0), "dummy"), "smoke") == "dummy"


@pytest.mark.parametrize("fast", ["1", "0"])
def test_worker_processes_record_the_fast_path_by_their_familys_fast_path_flag(fast: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Envs in worker processes cannot be inspected from here, so the family's flag decides, whatever the family is called.
    # The envs here are smoke envs: only the family's record is read, never the workers' envs.
    from dataclasses import replace

    from rl_moe.envs import families

    monkeypatch.setenv(METAWORLD_FAST_VAR, fast)
    monkeypatch.setitem(families.FAMILIES, "my-metaworld", replace(families.FAMILIES["metaworld"], name="my-metaworld"))
    # Sawyer scenes built without the fast path (a family calling gym.make itself) are not fast
    monkeypatch.setitem(families.FAMILIES, "plain-sawyer", replace(families.FAMILIES["metaworld"], name="plain-sawyer", fast_path=False))
    smoke = suite_of(resolve(RunRequest(suite="smoke", method="topk", tasks=1, vec_env="dummy")))
    env = make_vec_env(task_factories(smoke, smoke.tasks[0], 2, 0), "subproc")  # one env would run in process
    try:
        assert provenance.vec_env_backend(env, "my-metaworld") == ("subproc+fast" if fast == "1" else "subproc")
        assert provenance.vec_env_backend(env, "smoke") == "subproc"
        assert provenance.vec_env_backend(env, "plain-sawyer") == "subproc"
        assert provenance.vec_env_backend(env, "not-registered") == "subproc"
    finally:
        env.close()


def test_a_run_outside_metaworld_never_loads_mujoco(tmp_path: Path) -> None:
    # A smoke run once imported MuJoCo's bindings lazily (its backend's provenance, the in-task
    # checkpoint's env snapshot); a Ctrl-C landing in that import became an ImportError. In a fresh
    # interpreter: this test process has MuJoCo loaded already.
    code = (
        "import sys\n"
        "from rl_moe.crl import main\n"
        f"argv = ['--suite', 'smoke', '--method', 'topk', '--tasks', '2', '--steps-per-task', '600', '--preset', 'tiny', '--no-progress', '--run-dir', {str(tmp_path / 'run')!r}, '--set', 'checkpoint.every_steps=200']\n"
        "print(main(argv), 'mujoco' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-2:] == ["0", "False"], out.stdout
    assert (tmp_path / "run" / "checkpoints").is_dir()  # the in-task checkpoints snapshot the envs


def test_a_run_records_its_commit_and_each_stretch_of_training(tmp_path: Path, stop_before_task) -> None:  # type: ignore[no-untyped-def]
    from rl_moe.crl import main

    run = tmp_path / "run"
    argv = ["--suite", "smoke", "--method", "topk", "--tasks", "2", "--steps-per-task", "512", "--preset", "tiny", "--no-progress", "--run-dir", str(run)]
    assert stop_before_task(argv, 1) == 130
    assert main(argv) == 0
    code = provenance.code_version()
    assert json.loads((run / "config.json").read_text())["code"] == code
    stretches = json.loads((run / "results.json").read_text())["provenance"]
    # task 1 started once in the first process (then interrupted before training) and again on resume
    assert [(s["task"], s["name"], s["from_step"], s["backend"]) for s in stretches][0] == (0, "pendulum-0", 0, "dummy")
    assert [(s["task"], s["from_step"]) for s in stretches][-1] == (1, 512)
    assert all(s["commit"] == code["commit"] and s["dirty"] == code["dirty"] for s in stretches)
    from rl_moe.fingerprint import kernel_machine

    assert all(s["cpu"] == kernel_machine()["cpu"] != "" for s in stretches)  # the machine each stretch trained on
    from rl_moe.envs.threads import available_cores

    assert all(s["cores"] == available_cores() >= 1 for s in stretches)  # and the cores it could use
