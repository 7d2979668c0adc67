"""``--vec-env envpool``: EnvPool's native MetaWorld v3 against the official envs.

The backends cannot share a random stream, so equivalence is statistical: MetaWorld's scripted
policies, 50 episodes per CW10 task, against the official numbers in
``tests/data/cw10_expert_stats.json`` (a slow test checks that file against the official envs).
Tests that need the package skip when it is absent; CI installs the ``envpool`` extra.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from stable_baselines3.common.vec_env import DummyVecEnv

from rl_moe.continual.evaluation import EvalEnvs
from rl_moe.crl import main
from rl_moe.envs import envpool_env
from rl_moe.envs.backend_check import N_EPISODES, expert_statistics
from rl_moe.envs.envpool_env import ENVPOOL_MISMATCHED, ENVPOOL_VERIFIED, EnvPoolMetaWorld, envpool_task_id, official_observation_space
from rl_moe.envs.factories import make_vec_env, resolve_vec_env_type, task_factories
from rl_moe.envs.suites import load_suite
from rl_moe.envs.threads import parse_threads, split_threads
from rl_moe.errors import MissingDependencyError, UsageError
from tests.conftest import needs_envpool

STATS = Path(__file__).parent / "data" / "cw10_expert_stats.json"
CW10 = load_suite("cw10-cw")


def _task(name: str):
    return next(t for t in CW10.tasks if t.name == name)


def _pool(name: str, seeds: list[int]) -> EnvPoolMetaWorld:
    return EnvPoolMetaWorld(name, seeds, CW10.episode_length, 1, official_observation_space())


# ---- no package needed ---------------------------------------------------------------------------
def test_task_ids_follow_envpool_naming() -> None:
    assert envpool_task_id("faucet-close-v3") == "MetaWorld/FaucetClose-v3"
    assert envpool_task_id("peg-unplug-side-v3") == "MetaWorld/PegUnplugSide-v3"


def test_observation_space_is_the_official_one_for_every_cw10_task() -> None:
    """Same space on both backends, so SB3 accepts a checkpoint on either."""
    for task in CW10.tasks:
        env = make_vec_env(task_factories(CW10, task, 1, 0), "dummy")
        assert env.observation_space == official_observation_space(), task.name
        env.close()


def test_every_cw10_task_is_classified() -> None:
    assert set(ENVPOOL_VERIFIED) | set(ENVPOOL_MISMATCHED) == set(CW10.task_names)
    assert not set(ENVPOOL_VERIFIED) & set(ENVPOOL_MISMATCHED)


def test_auto_measures_between_the_backends_for_metaworld_only_when_pool_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(envpool_env, "envpool_installed", lambda: True)
    assert resolve_vec_env_type("auto", 8, 2, "metaworld") == "auto"
    assert resolve_vec_env_type("auto", 8, 2, "smoke") == "dummy"
    assert resolve_vec_env_type("auto", 8, 16, "smoke") == "subproc"
    monkeypatch.setattr(envpool_env, "envpool_installed", lambda: False)
    assert resolve_vec_env_type("auto", 8, 2, "metaworld") == "dummy"
    with pytest.raises(MissingDependencyError, match=r"pip install 'rl_moe\[envpool\]'"):
        resolve_vec_env_type("envpool", 8, 2, "metaworld")


def test_envpool_for_a_family_without_it_is_refused() -> None:
    with pytest.raises(UsageError, match="serves suites of: metaworld"):
        resolve_vec_env_type("envpool", 8, 2, "smoke")


def test_missing_envpool_exits_2_naming_the_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(envpool_env, "envpool_installed", lambda: False)
    out = tmp_path / "runs"
    assert main(["--suite", "cw10-cw", "--vec-env", "envpool", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'rl_moe[envpool]'" in err
    assert not out.exists()


def test_resuming_an_envpool_run_without_the_package_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from rl_moe.continual.resolve import RunRequest, resolve

    monkeypatch.setattr(envpool_env, "envpool_installed", lambda: True)
    cfg = resolve(RunRequest(suite="cw10-cw", tasks=2, vec_env="envpool", preset="tiny"))
    run = tmp_path / "run"
    run.mkdir()
    cfg.save(str(run / "config.json"))  # a run that stopped before its first task ended
    monkeypatch.setattr(envpool_env, "envpool_installed", lambda: False)
    assert main(["--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert "steps or evaluates its envs with envpool (envpool)" in err and "pip install 'rl_moe[envpool]'" in err
    assert sorted(p.name for p in run.iterdir()) == ["config.json"]


def test_threads_split_never_computes_on_more_threads_than_cores() -> None:
    """Torch and the pool take turns, so each may use the run's cores, and neither more."""
    assert split_threads(None, "envpool", 8, cores=2) == (2, 2)
    assert split_threads(None, "envpool", 8, cores=16) == (2, 8)  # no more workers than envs
    assert split_threads(None, "envpool", 8, cores=1) == (1, 1)
    assert split_threads(None, "dummy", 8, cores=2) == (1, 0)
    assert split_threads(1, "envpool", 8, cores=2) == (1, 1)  # a sweep trial with one CPU
    assert split_threads(3, "dummy", 8, cores=2) == (3, 0)
    for cores in (1, 2, 3, 4, 8, 16):
        t, p = split_threads(None, "envpool", 8, cores=cores)
        assert t <= cores and p <= cores
    assert parse_threads("auto") is None and parse_threads("3") == 3
    for bad in ("0", "-1", "x"):
        with pytest.raises(UsageError, match="--threads must be a positive integer or auto"):
            parse_threads(bad)


@pytest.mark.parametrize("value", ["0", "two"])
def test_bad_threads_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture, value: str) -> None:
    assert main(["--suite", "smoke", "--threads", value, "--out", str(tmp_path / "r")]) == 2
    assert f"got {value!r}" in capsys.readouterr().err


# ---- the adapter ---------------------------------------------------------------------------------
@needs_envpool
def test_contract_matches_dummy_vec_env() -> None:
    """Shapes, dtypes, info keys, dones, terminal_observation and the reset observation, over two
    episodes of 200 steps."""
    factories = task_factories(CW10, _task("faucet-close-v3"), 3, 5)
    ref, env = make_vec_env(factories, "dummy"), make_vec_env(factories, "envpool")
    assert isinstance(ref, DummyVecEnv) and isinstance(env, EnvPoolMetaWorld)
    assert (env.num_envs, env.observation_space, env.action_space) == (ref.num_envs, ref.observation_space, ref.action_space)
    a, b = ref.reset(), env.reset()
    assert (a.dtype, a.shape) == (b.dtype, b.shape) == (np.float64, (3, 39))
    rng = np.random.default_rng(0)
    for t in range(1, 401):
        act = rng.uniform(-1, 1, (3, 4)).astype(np.float32)
        (oa, ra, da, ia), (ob, rb, db, ib) = ref.step(act), env.step(act)
        assert (oa.dtype, oa.shape, ra.dtype, ra.shape, da.dtype) == (ob.dtype, ob.shape, rb.dtype, rb.shape, db.dtype)
        assert np.array_equal(da, db) and db.all() == (t % 200 == 0) and db.any() == (t % 200 == 0)
        for x, y in zip(ia, ib):
            assert set(x) == set(y)
            assert type(x["is_success"]) is type(y["is_success"]) is bool
            if t % 200 == 0:
                assert set(x["episode"]) == set(y["episode"]) and y["episode"]["l"] == 200
                assert y["TimeLimit.truncated"] is True and x["TimeLimit.truncated"] is True
                term = y["terminal_observation"]
                assert term.dtype == x["terminal_observation"].dtype and term.shape == (39,)
        if t % 200 == 0:  # the returned observation starts the next episode, with a new goal
            assert all(not np.array_equal(ib[i]["terminal_observation"], ob[i]) for i in range(3))
            assert all(not np.allclose(ib[i]["terminal_observation"][-3:], ob[i][-3:]) for i in range(3))
    ref.close()
    env.close()


@needs_envpool
def test_same_seeds_same_trajectory_other_seeds_other_goals() -> None:
    rng = np.random.default_rng(1)
    actions = rng.uniform(-1, 1, (260, 2, 4)).astype(np.float32)

    def roll(seeds: list[int]) -> tuple[np.ndarray, np.ndarray]:
        env = _pool("push-v3", seeds)
        obs, rews = [env.reset()], []
        for a in actions:
            o, r, _, _ = env.step(a)
            obs.append(o)
            rews.append(r)
        env.close()
        return np.stack(obs), np.stack(rews)

    o1, r1 = roll([3, 4])
    o2, r2 = roll([3, 4])
    o3, _ = roll([5, 6])
    assert np.array_equal(o1, o2) and np.array_equal(r1, r2)
    assert not np.allclose(o1[0, :, -3:], o3[0, :, -3:])  # goals come from the seeds
    assert not np.allclose(o1[0, 0, -3:], o1[0, 1, -3:])  # one seed per sub-env
    assert not np.allclose(o1[0, 0, -3:], o1[201, 0, -3:])  # a fresh goal at every reset


@needs_envpool
def test_tasks_not_verified_run_on_official_envs(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from rl_moe.envs import factories

    monkeypatch.setattr(factories, "_FELL_BACK", set())
    for name in ENVPOOL_MISMATCHED:
        for _ in range(2):
            env = make_vec_env(task_factories(CW10, _task(name), 2, 0), "envpool")
            assert isinstance(env, DummyVecEnv)
            env.close()
        err = capsys.readouterr().err
        assert err.count(f"note: {name} runs on the official in-process envs") == 1 and ENVPOOL_MISMATCHED[name] in err
    env = make_vec_env(task_factories(CW10, _task("push-v3"), 2, 0), "envpool")
    assert isinstance(env, EnvPoolMetaWorld)
    env.close()
    # EnvPool computes MetaWorld's default reward only: another reward version runs in-process.
    v1 = dataclasses.replace(_task("push-v3"), params={"reward_version": "v1"})
    env = make_vec_env(task_factories(CW10, v1, 2, 0), "envpool")
    assert isinstance(env, DummyVecEnv) and env.envs[0].unwrapped.reward_function_version == "v1"
    env.close()
    assert "push-v3 runs on the official in-process envs, not EnvPool: EnvPool computes MetaWorld's default reward only, not reward_version 'v1'" in capsys.readouterr().err


@needs_envpool
def test_evaluation_envs_use_the_backend_and_score_the_same_goals_every_time() -> None:
    factories = task_factories(CW10, _task("window-close-v3"), 2, 77)
    pool = EvalEnvs(factories, "envpool")
    first = pool.get(2)
    assert isinstance(first, EnvPoolMetaWorld)
    a = first.reset()
    first.step(np.zeros((2, 4), np.float32))
    b = pool.get(2).reset()
    assert np.array_equal(a, b)
    pool.close()


# ---- statistical equivalence ---------------------------------------------------------------------
def _success_tolerance(p: float, n: int) -> float:
    """±0.1, or three binomial standard errors of a difference where the expert is unsure
    (push-back: p ≈ 0.7, where ±0.1 over 50 episodes is one standard error)."""
    return max(0.1, 3 * np.sqrt(2 * p * (1 - p) / n))


def _differences(ref: dict, got: dict) -> list[str]:
    """The checks ``got`` fails against ``ref``; each tolerance is stated in its message."""
    n = ref["n_episodes"]
    bad = []
    tol = _success_tolerance(ref["success"], n)
    if abs(got["success"] - ref["success"]) > tol:
        bad.append(f"success {got['success']:.2f} vs {ref['success']:.2f} (tolerance {tol:.2f})")
    se = np.sqrt((ref["return_std"] ** 2 + got["return_std"] ** 2) / n)
    if abs(got["return_mean"] - ref["return_mean"]) > 3 * se + 1e-6:
        bad.append(f"mean return {got['return_mean']:.1f} vs {ref['return_mean']:.1f} (tolerance 3 standard errors = {3 * se:.1f})")
    rm, gm, rs, gs = (np.asarray(ref["obs_mean"]), np.asarray(got["obs_mean"]), np.asarray(ref["obs_std"]), np.asarray(got["obs_std"]))
    pooled = np.maximum(np.sqrt((rs**2 + gs**2) / 2), 0.01)
    if (np.abs(gm - rm) > 0.5 * pooled).any():
        bad.append(f"observation means differ by more than 0.5 std in dims {np.flatnonzero(np.abs(gm - rm) > 0.5 * pooled).tolist()}")
    varied = rs > 0.01
    ratio = gs[varied] / rs[varied]
    if ((ratio < 0.5) | (ratio > 2.0)).any():
        bad.append(f"observation stds differ by more than 2x in dims {np.flatnonzero(varied)[(ratio < 0.5) | (ratio > 2.0)].tolist()}")
    return bad


@needs_envpool
@pytest.mark.parametrize("name", sorted(ENVPOOL_VERIFIED))
def test_verified_tasks_match_the_official_statistics(name: str) -> None:
    ref = json.loads(STATS.read_text())["tasks"][name]
    got = expert_statistics(CW10, _task(name), "envpool")
    assert got["n_episodes"] == ref["n_episodes"] == N_EPISODES
    assert not _differences(ref, got), _differences(ref, got)


@pytest.mark.slow
@needs_envpool
@pytest.mark.parametrize("name", sorted(ENVPOOL_MISMATCHED))
def test_mismatched_tasks_really_differ(name: str) -> None:
    """Keeps ENVPOOL_MISMATCHED honest: a fixed EnvPool release makes this fail, and the task can
    move to ENVPOOL_VERIFIED."""
    ref = json.loads(STATS.read_text())["tasks"][name]
    assert _differences(ref, expert_statistics(CW10, _task(name), "envpool"))


@pytest.mark.slow
def test_stored_official_statistics_are_current() -> None:
    """The reference file is what the official envs give today (deterministic seeds)."""
    stored = json.loads(STATS.read_text())
    assert stored["meta"]["backend"] == "official" and stored["meta"]["episode_length"] == CW10.episode_length
    for task in CW10.tasks:
        got = expert_statistics(CW10, task, "official")
        ref = stored["tasks"][task.name]
        assert got["success"] == ref["success"] and np.isclose(got["return_mean"], ref["return_mean"], rtol=1e-9), task.name
        assert np.allclose(got["obs_mean"], ref["obs_mean"], rtol=1e-9, atol=1e-12), task.name


# ---- a run ---------------------------------------------------------------------------------------
@needs_envpool
def test_envpool_run_records_its_backend_and_a_resume_may_not_change_it(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Three CW10 tasks: hammer (kept on the official envs) and two on EnvPool."""
    run = tmp_path / "run"
    argv = ["--suite", "cw10-cw", "--method", "topk", "--tasks", "3", "--steps-per-task", "128", "--run-dir", str(run),
            "--preset", "tiny", "--no-progress", "--set", "eval.n_episodes=2", "--set", "eval.matrix_episodes=2"]  # fmt: skip
    assert main([*argv, "--vec-env", "envpool"]) == 0
    assert json.loads((run / "config.json").read_text())["vec_env"] == "envpool"
    res = json.loads((run / "results.json").read_text())
    assert res["complete"] and all(v is not None for v in res["success_matrix"][-1])
    assert main(["--resume", str(run), "--vec-env", "dummy"]) == 2
    assert "--vec-env dummy conflicts with the resumed run's stored 'envpool'" in capsys.readouterr().err


def test_a_run_names_its_fallbacks_once_at_its_start(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """One line for the whole run, grouped by reason; the per-task notes stay silent afterwards."""
    from rl_moe.envs import factories
    from rl_moe.envs.suites import load_suite

    monkeypatch.setattr(factories, "_FELL_BACK", set())
    paper = load_suite("cw10")
    factories.announce_fallbacks(paper, list(paper.tasks))
    err = capsys.readouterr().err.strip().splitlines()
    # the paper's protocol rules EnvPool out for every task: one reason in plain words, no per-task detail
    assert err == [
        "note: EnvPool is not used for this run: the suite keeps each task's object and goal positions fixed, "
        "and EnvPool's MetaWorld draws new ones at every reset; every task runs on the official envs"
    ]
    factories._note_fallback("push-wall-v3", factories.FAMILIES["metaworld"].pool_refusal(paper.tasks[1]))  # type: ignore[misc]
    assert capsys.readouterr().err == ""
    cw = load_suite("cw10-cw")
    factories.announce_fallbacks(cw, list(cw.tasks))
    line = capsys.readouterr().err.strip()
    assert line.startswith("note: 3 of 10 tasks run on the official envs, not EnvPool (") and all(t in line for t in ENVPOOL_MISMATCHED)
    assert line.count("EnvPool's version of the task behaves differently") == 3 and "\n" not in line


def test_envpool_named_for_a_suite_it_cannot_serve_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """cw10 keeps fixed positions, which EnvPool's MetaWorld cannot: a user who names envpool is
    told so before anything starts, rather than getting a run on the official envs."""
    out = tmp_path / "runs"
    assert main(["--suite", "cw10", "--tasks", "1", "--vec-env", "envpool", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--vec-env envpool cannot run suite 'cw10'" in err and "positions" in err and "auto, dummy, subproc" in err
    assert not out.exists()
