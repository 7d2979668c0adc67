"""Suites, env factories and wrappers of rl_moe.continual (real MetaWorld, fake HumanoidBench)."""

from __future__ import annotations

from collections.abc import Callable

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from rl_moe.continual.config import SECTIONS, RunConfig
from rl_moe.envs.factories import EnvFactory, resolve_vec_env_type, task_factories
from rl_moe.envs.suites import builtin_suites, load_suite
from rl_moe.envs.wrappers import InfoSuccess, PermuteObsFlipAction, ReturnSuccess
from rl_moe.errors import MissingDependencyError, UsageError

REPO = Path(__file__).resolve().parents[1]
SUITES = REPO / "envs" / "suites"
CW10 = ["hammer", "push-wall", "faucet-close", "push-back", "stick-pull", "handle-press-side", "push", "shelf-place", "window-close", "peg-unplug-side"]


def test_builtin_suites_and_protocol_facts() -> None:
    assert set(builtin_suites()) >= {"cw10-cw", "cw20-cw", "hb5", "smoke"}
    cw10, cw20, hb5 = load_suite("cw10-cw"), load_suite("cw20-cw"), load_suite("hb5")
    assert list(cw10.task_names) == [f"{t}-v3" for t in CW10]
    assert cw20.task_names == cw10.task_names * 2
    assert (cw10.steps_per_task, cw10.episode_length, cw10.success_type) == (1_000_000, 200, "info")
    paper, paper20 = load_suite("cw10"), load_suite("cw20")  # the SPHERE paper's protocol on the same tasks
    assert paper.task_names == cw10.task_names and paper20.task_names == cw20.task_names
    for suite in (paper, paper20):
        assert (suite.steps_per_task, suite.episode_length) == (1_000_000, 500)
        assert {t.params["position_rule"] for t in suite.tasks} == {"fixed"} and suite.eval == {"positions": "both"}
        assert suite.presets["ppo"] == "metaworld-paper"
    assert hb5.task_names == ("h1-stand-v0", "h1-walk-v0", "h1-pole-v0", "h1-slide-v0", "h1-run-v0")
    assert [t.success_bar for t in hb5.tasks] == [800.0, 700.0, 700.0, 700.0, 700.0]
    assert (hb5.steps_per_task, hb5.episode_length) == (10_000_000, 1000)
    for name in builtin_suites():
        suite = load_suite(name)
        assert suite.probe_tasks and not {t.name for t in suite.probe_tasks} & set(suite.task_names)


def test_user_suite_file_and_errors(tmp_path: Path) -> None:
    data = json.loads((SUITES / "smoke.json").read_text())
    data["name"], data["tasks"] = "mine", data["tasks"][:1]
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(data))
    assert load_suite(str(path)).task_names == ("pendulum-0",)
    with pytest.raises(UsageError, match="valid choices: cw10, cw10-cw, cw20, cw20-cw, hb5, smoke, cw10-paper"):
        load_suite("cw11")
    del data["family"]
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError, match="'family'"):
        load_suite(str(path))
    data["family"], data["probe_tasks"] = "smoke", [data["tasks"][0]]
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError, match="outside the task sequence"):
        load_suite(str(path))
    data["probe_tasks"] = []
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError, match="probe_tasks is empty"):
        load_suite(str(path))
    # Suite files and run configs written with a single probe_task still load.
    data["probe_task"] = data.pop("probe_tasks") or {"name": "held-out", "success_bar": -400.0}
    path.write_text(json.dumps(data))
    assert [t.name for t in load_suite(str(path)).probe_tasks] == ["held-out"]


def _mutations() -> list[tuple[str, object, str]]:
    """(what, how to break the smoke suite, expected message)."""
    def setter(key, value):
        return lambda d: d.__setitem__(key, value)

    def no_bar(d):
        d["tasks"] = [{k: v for k, v in t.items() if k != "success_bar"} for t in d["tasks"]]

    return [
        ("family", setter("family", "atari"), "unknown env family 'atari'"),
        ("success", setter("success", {"type": "vibes"}), "unknown success type 'vibes'"),
        ("no tasks", setter("tasks", []), "has no tasks"),
        ("steps", setter("steps_per_task", 0), "must be > 0"),
        ("episode", setter("episode_length", -1), "must be > 0"),
        ("success bar", no_bar, "have no success_bar"),
        ("malformed", setter("tasks", 7), "malformed suite"),
        ("name escapes --out", setter("name", "../../evil"), "must be one folder name"),
        ("fractional steps", setter("steps_per_task", 1.5), "steps_per_task must be a whole number, got 1.5"),
        ("string length", setter("episode_length", "200"), "episode_length must be a whole number"),
        ("name is a path", setter("name", "a/b"), "must be one folder name"),
    ]


@pytest.mark.parametrize(("what", "mutate", "message"), _mutations(), ids=[m[0] for m in _mutations()])
def test_broken_user_suites_are_usage_errors(tmp_path: Path, what: str, mutate, message: str) -> None:
    data = json.loads((SUITES / "smoke.json").read_text())
    mutate(data)
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError, match=message):
        load_suite(str(path))


@pytest.mark.parametrize(("text", "message"), [("{oops", "cannot read suite file"), ("[1, 2]", "must hold a JSON object")])
def test_unreadable_user_suite_files(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(UsageError, match=message):
        load_suite(str(path))


class _ScriptedEnv(gym.Env):
    """Emits scripted rewards / success flags; terminated as numpy.bool_ like HumanoidBench."""

    def __init__(self, rewards: list[float], flags: list[bool], obs_dim: int = 51, act_dim: int = 19) -> None:
        self.rewards, self.flags = rewards, flags
        self.observation_space = spaces.Box(-np.inf, np.inf, (obs_dim,), np.float64)
        self.action_space = spaces.Box(-1, 1, (act_dim,), np.float32)
        self.t = 0

    def reset(self, *, seed=None, options=None):  # type: ignore[override]
        self.t = 0
        return np.zeros(self.observation_space.shape), {}

    def step(self, action):  # type: ignore[override]
        r, flag = self.rewards[self.t], self.flags[self.t]
        self.t += 1
        done = np.bool_(self.t == len(self.rewards))
        return np.full(self.observation_space.shape, self.t, float), r, done, np.bool_(False), {"success": flag}


def test_info_success_is_any_step() -> None:
    env = InfoSuccess(_ScriptedEnv([0.0] * 4, [False, True, False, False]))
    env.reset()
    verdicts = [env.step(np.zeros(19))[4]["is_success"] for _ in range(4)]
    assert verdicts == [False, True, True, True]
    env.reset()
    assert env.step(np.zeros(19))[4]["is_success"] is False  # reset clears the flag


def test_return_success_threshold_bool_terminated_and_shapes() -> None:
    # HumanoidBench H1 shapes; stand needs return >= 800.
    env = ReturnSuccess(_ScriptedEnv([300.0, 300.0, 199.0], [False] * 3), success_bar=800.0)
    obs, _ = env.reset()
    assert obs.shape == (51,) and env.action_space.shape == (19,)
    out = [env.step(np.zeros(19)) for _ in range(3)]
    assert [o[4]["is_success"] for o in out] == [False, False, False]  # 799 < 800
    assert type(out[-1][2]) is bool and out[-1][2] is True
    env = ReturnSuccess(_ScriptedEnv([300.0, 300.0, 200.0], [False] * 3), success_bar=800.0)
    env.reset()
    assert [env.step(np.zeros(19))[4]["is_success"] for _ in range(3)][-1] is True  # exactly 800


def test_permute_flip_matches_transformed_base_env() -> None:
    base = gym.make("Pendulum-v1", disable_env_checker=True)
    wrapped = PermuteObsFlipAction(gym.make("Pendulum-v1", disable_env_checker=True), [2, 0, 1], -1.0)
    o_base, _ = base.reset(seed=3)
    o_wrap, _ = wrapped.reset(seed=3)
    np.testing.assert_allclose(o_wrap, o_base[[2, 0, 1]])
    for a in (0.5, -1.5, 2.0):
        o_base, r_base, *_ = base.step(np.array([-a], np.float32))
        o_wrap, r_wrap, *_ = wrapped.step(np.array([a], np.float32))
        np.testing.assert_allclose(o_wrap, o_base[[2, 0, 1]])
        assert r_wrap == pytest.approx(r_base)
    other = PermuteObsFlipAction(gym.make("Pendulum-v1", disable_env_checker=True), [1, 2, 0], 1.0)
    assert other.observation_space == wrapped.observation_space  # shared spaces across tasks


def test_metaworld_factory_continual_world_protocol() -> None:
    suite = load_suite("cw10-cw")
    env = EnvFactory(suite.family, suite.tasks[6], suite.episode_length, suite.success_type, seed=7)()  # push-v3
    goals = []
    for _ in range(3):
        obs, _ = env.reset()
        goals.append(obs[-3:].copy())
    assert obs.shape == (39,) and env.action_space.shape == (4,)
    assert not np.allclose(goals[0], goals[1]) and not np.allclose(goals[1], goals[2])  # fresh goal each reset
    steps, done = 0, False
    while not done:
        _, _, terminated, truncated, info = env.step(env.action_space.sample())
        steps += 1
        done = terminated or truncated
    assert steps == 200 and truncated and isinstance(info["is_success"], bool)
    again = EnvFactory(suite.family, suite.tasks[6], suite.episode_length, suite.success_type, seed=7)()
    np.testing.assert_allclose(again.reset()[0][-3:], goals[0])  # seeded: reproducible goals


def test_vec_env_type_by_core_count() -> None:
    assert resolve_vec_env_type("auto", 8, cpu_count=2) == "dummy"
    assert resolve_vec_env_type("auto", 8, cpu_count=16) == "subproc"
    assert resolve_vec_env_type("auto", 1, cpu_count=16) == "dummy"
    assert resolve_vec_env_type("subproc", 8, cpu_count=2) == "subproc"
    with pytest.raises(UsageError, match="valid choices: auto, dummy, subproc"):
        resolve_vec_env_type("ray", 8)


def test_subproc_and_dummy_vec_envs_step_the_same_envs() -> None:
    # Worker processes must build the same seeded envs as in-process ones (the factories pickle).
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    from rl_moe.envs.factories import make_vec_env

    suite = load_suite("smoke")
    firsts = {}
    for kind, cls in (("dummy", DummyVecEnv), ("subproc", SubprocVecEnv)):
        venv = make_vec_env(task_factories(suite, suite.tasks[0], 2, 3), kind)
        try:
            assert isinstance(venv, cls)
            obs = venv.reset()
            obs2, reward, _, _ = venv.step(np.zeros((2, 1), dtype=np.float32))
            firsts[kind] = (obs, obs2, reward)
        finally:
            venv.close()
    for a, b in zip(firsts["dummy"], firsts["subproc"]):
        np.testing.assert_allclose(a, b)


def test_smoke_factories_seed_envs_differently() -> None:
    suite = load_suite("smoke")
    f0, f1 = task_factories(suite, suite.tasks[0], 2, seed=11)
    assert (f0.seed, f1.seed) == (11, 12)
    assert not np.allclose(f0().reset()[0], f1().reset()[0])


def test_jax_stub_installs_only_when_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    from rl_moe.envs import humanoidbench

    if importlib.util.find_spec("jax") is not None:
        pytest.skip("jax is installed; no stub needed")
    monkeypatch.delitem(sys.modules, "jax", raising=False)
    monkeypatch.delitem(sys.modules, "jax.numpy", raising=False)
    humanoidbench._install_jax_stub()
    import jax.numpy as jnp  # type: ignore[import-not-found]

    with pytest.raises(RuntimeError, match="stub"):
        jnp.zeros(3)
    for name in [m for m in sys.modules if m == "jax" or m.startswith("jax.")]:
        monkeypatch.delitem(sys.modules, name)


@pytest.mark.skipif(importlib.util.find_spec("humanoid_bench") is not None, reason="HumanoidBench is installed")
def test_humanoidbench_missing_names_install_command() -> None:
    suite = load_suite("hb5")
    with pytest.raises(MissingDependencyError, match="mujoco==3.3.0 .*pip install --no-deps -e humanoid-bench"):
        EnvFactory(suite.family, suite.tasks[0], suite.episode_length, suite.success_type, seed=0)()


@pytest.mark.parametrize("present", [(), ("envs",), ("dmc_deps",)])
def test_broken_humanoidbench_install_exits_2_naming_the_fix(tmp_path, monkeypatch: pytest.MonkeyPatch, capsys, present) -> None:
    """A non-editable install (``git+`` included) has ``humanoid_bench`` without ``envs/`` or
    ``dmc_deps/``: one line, exit 2, naming the editable install (a fake package stands in)."""
    from rl_moe.crl import main

    pkg = tmp_path / "site" / "humanoid_bench"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from humanoid_bench.envs import basic  # noqa: F401\n")
    for name in present:
        (pkg / name).mkdir()
    (tmp_path / "site" / "dm_control").mkdir()
    (tmp_path / "site" / "dm_control" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for name in ("humanoid_bench", "dm_control"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert main(["--suite", "hb5", "--out", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "broken" in err[0] and "pip install --no-deps -e humanoid-bench" in err[0], err
    assert not (tmp_path / "runs").exists()


def test_core_install_pins_mujoco_for_metaworld() -> None:
    """An extra package (dm_control pulls mujoco 4) must not be able to upgrade MuJoCo under MetaWorld."""
    tomllib = pytest.importorskip("tomllib")
    deps = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "mujoco==3.3.0" in deps


@pytest.mark.skipif(importlib.util.find_spec("humanoid_bench") is None, reason="HumanoidBench not installed")
def test_humanoidbench_real_env() -> None:
    suite = load_suite("hb5")
    env = EnvFactory(suite.family, suite.tasks[1], suite.episode_length, suite.success_type, seed=0)()
    obs, _ = env.reset()
    assert obs.shape == (51,) and env.action_space.shape == (19,)
    _, _, terminated, truncated, info = env.step(env.action_space.sample())
    assert type(terminated) is bool and type(truncated) is bool and "is_success" in info


def test_metaworld_factory_leaves_global_numpy_rng_alone() -> None:
    suite = load_suite("cw10-cw")
    np.random.seed(123)
    expected = np.random.rand(3)
    np.random.seed(123)
    EnvFactory(suite.family, suite.tasks[0], suite.episode_length, suite.success_type, seed=5)()
    np.testing.assert_array_equal(np.random.rand(3), expected)


def test_registries_cover_every_builtin_suite() -> None:
    from rl_moe.envs.families import FAMILIES
    from rl_moe.continual.learners import LEARNERS
    from rl_moe.continual.presets import learner_presets
    from rl_moe.continual.resolve import DEFAULT_PRESET

    for name in builtin_suites():
        suite = load_suite(name)
        assert suite.family in FAMILIES, name
        for algo, spec in LEARNERS.items():
            preset = learner_presets(algo)[suite.presets.get(algo, DEFAULT_PRESET)]
            assert isinstance(preset, spec.config_cls), (name, algo)


def test_suite_name_cannot_write_outside_out(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from rl_moe.crl import main

    data = json.loads((SUITES / "smoke.json").read_text())
    data["name"] = "../../evil"
    path = tmp_path / "evil.json"
    path.write_text(json.dumps(data))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert main(["--suite", str(path), "--tasks", "1", "--out", str(tmp_path / "a" / "b"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "must be one folder name" in err[0], err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_suite_regularizer_values_are_type_checked(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from rl_moe.crl import main

    data = json.loads((SUITES / "smoke.json").read_text())
    data["regularizers"] = {"sphere": {"rho": "abc"}}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    out = tmp_path / "runs"
    assert main(["--suite", str(path), "--method", "sphere", "--tasks", "1", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'rho' must be float, got 'abc'" in err[0], err
    assert not out.exists()


def test_suite_network_defaults_sit_under_preset_and_set(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from rl_moe.continual.resolve import RunRequest, resolve
    from rl_moe.crl import main

    smoke = resolve(RunRequest(suite="smoke", algo="td3", method="topk"))
    assert (smoke.net.hidden, smoke.net.gate_hidden, smoke.net.n_experts) == ((64, 64), (32,), 10)
    assert smoke.td3.n_envs == 4
    assert resolve(RunRequest(suite="smoke", preset="tiny")).net.hidden == (32, 32)  # --preset beats the suite
    assert resolve(RunRequest(suite="smoke", overrides=("net.hidden=16",))).net.hidden == (16,)  # --set too
    assert resolve(RunRequest(suite="cw10-cw", method="topk")).net.hidden == (256, 256, 256)  # SPHERE Table 2
    data = json.loads((SUITES / "smoke.json").read_text())
    # the suite's defaults go in as typed values (no text round trip): an int where a float is due
    # becomes that float, a list a tuple; any other type is refused in one line
    good = tmp_path / "good.json"
    good.write_text(json.dumps({**data, "net": {"temperature": 2, "hidden": [8, 8]}, "eval": {"n_episodes": 3, "full_matrix": False}}))
    cfg = resolve(RunRequest(suite=str(good), algo="td3", method="topk"))
    assert (cfg.net.temperature, type(cfg.net.temperature), cfg.net.hidden) == (2.0, float, (8, 8))
    assert (cfg.eval.n_episodes, cfg.eval.full_matrix) == (3, False)
    for section, bad in (("eval", {"n_episodes": 2.5}), ("eval", {"full_matrix": 1}), ("net", {"temperature": "hot"})):
        good.write_text(json.dumps({**data, section: bad}))
        with pytest.raises(UsageError, match=f"bad value .* for {section}.{next(iter(bad))}: expected"):
            resolve(RunRequest(suite=str(good), algo="td3", method="topk"))
    for bad, message in (({"kind": "dense"}, "unknown net setting 'kind'"), ({"hiden": [8]}, "unknown net setting 'hiden'"), ({"hidden": "x,y"}, "net.hidden")):
        path = tmp_path / "bad.json"
        path.write_text(json.dumps({**data, "net": bad}))
        assert main(["--suite", str(path), "--tasks", "1", "--out", str(tmp_path / "runs"), "--no-progress"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "runs").exists()


def test_run_config_sections_are_the_settable_sections_and_pick_the_learners():
    cfg = RunConfig(suite="smoke", suite_data={}, tasks=("a",), algo="td3")
    assert set(cfg.sections()) == set(SECTIONS)
    assert all(isinstance(v, SECTIONS[k]) for k, v in cfg.sections().items())
    assert cfg.learner_settings is cfg.td3
    assert dataclasses.replace(cfg, algo="ppo").learner_settings is cfg.ppo


def _reward_after_one_still_step(reward_version: str | None, probe: Callable[[gym.Env], float] | None = None) -> tuple[float, float | None]:
    """hammer-v3's reward after one zero action, and ``probe(env)`` read then; the env is closed."""
    from rl_moe.envs.suite_spec import TaskSpec

    params = {} if reward_version is None else {"reward_version": reward_version}
    suite = load_suite("cw10-cw")
    env = EnvFactory(suite.family, TaskSpec("hammer-v3", params=params), suite.episode_length, suite.success_type, seed=3)()
    try:
        env.reset()
        _, reward, *_ = env.step(np.zeros(4, dtype=np.float32))
        return float(reward), None if probe is None else probe(env)
    finally:
        env.close()


def _reach(env: gym.Env) -> float:
    """Distance from the fingertips' midpoint to the hammer handle."""
    base = env.unwrapped
    fingers = (base._get_site_pos("rightEndEffector") + base._get_site_pos("leftEndEffector")) / 2
    return float(np.linalg.norm(base._get_pos_objects()[:3] - fingers))


def test_metaworld_reward_version_picks_the_reward_the_agent_sees() -> None:
    # hammer's v1 reward for a hand away from the handle is minus the handle-to-fingertips
    # distance (no pick, no hammer term); v2 pays grab and the at-rest "lifted" share instead.
    v1, reach = _reward_after_one_still_step("v1", _reach)
    assert reach is not None and reach > 0.1 and v1 == pytest.approx(-reach, abs=1e-6)
    v2, _ = _reward_after_one_still_step(None)
    assert v2 > 0.1  # grab and the at-rest "lifted" share: positive where v1 is negative
    assert _reward_after_one_still_step("v2")[0] == pytest.approx(v2)


def test_bad_metaworld_task_fields_exit_2_naming_the_choices(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from rl_moe.crl import main

    data = json.loads((SUITES / "cw10-cw.json").read_text())
    for task, message in (
        ({"name": "hammer-v3", "reward_version": "v9"}, "unknown reward_version 'v9' of MetaWorld task 'hammer-v3'; valid choices: v2, v1"),
        ({"name": "hammer-v3", "rewrd_version": "v1"}, "unknown field 'rewrd_version' of metaworld task 'hammer-v3'"),
    ):
        path = tmp_path / "bad.json"
        path.write_text(json.dumps({**data, "tasks": [task]}))
        assert main(["--suite", str(path), "--tasks", "1", "--out", str(tmp_path / "runs"), "--no-progress"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.update(regularisers={"sphere": {"rho": 0.1}}), "unknown suite key 'regularisers'"),
        (lambda d: d["success"].update(typ="info"), "unknown key 'typ' of success"),
        (lambda d: d.update(net={"hiden": [8]}), "unknown net setting 'hiden'"),
        (lambda d: d.update(eval={"n_episode": 3}), "unknown eval setting 'n_episode'"),
        (lambda d: d.update(presets={"ppo2": "smoke"}), "unknown learner 'ppo2'"),
        (lambda d: d.update(regularizers={"spher": {"rho": 0.1}}), "unknown regularizer 'spher'"),
        (lambda d: d["tasks"][0].update(permutaton=[0, 1, 2]), "unknown field 'permutaton' of smoke task 'pendulum-0'"),
    ],
    ids=["top", "success", "net", "eval", "presets", "regularizers", "task"],
)
def test_unknown_suite_keys_exit_2_with_the_nearest_valid_one(tmp_path: Path, capsys: pytest.CaptureFixture, change, message: str) -> None:
    from rl_moe.crl import main

    data = json.loads((SUITES / "smoke.json").read_text())
    change(data)
    path = tmp_path / "typo.json"
    path.write_text(json.dumps(data))
    assert main(["--suite", str(path), "--tasks", "1", "--out", str(tmp_path / "runs"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "did you mean" in err, err
    assert not (tmp_path / "runs").exists()
