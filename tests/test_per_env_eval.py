"""Per-env evaluation scores (the SPHERE authors' reading: the last step, envs 0 and 1) and their
place in ``results.json`` (``own_per_env``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from rl_moe.continual.evaluation import EvalEnvs, evaluate
from rl_moe.continual.results import Results


class _ScriptedEnvs:
    """A vector env whose episodes last one step; env i's n-th episode gives ``script[i][n]``,
    a pair (success at any step, success at the last step)."""

    def __init__(self, script: list[list[tuple[bool, bool]]]) -> None:
        self.script, self.num_envs = script, len(script)
        self.count = [0] * len(script)

    def reset(self) -> np.ndarray:
        return np.zeros((self.num_envs, 1))

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict]]:
        infos = []
        for i, episodes in enumerate(self.script):
            anywhere, last = episodes[min(self.count[i], len(episodes) - 1)]
            infos.append({"is_success": anywhere, "success_last": last, "episode": {"r": float(i)}})
            self.count[i] += 1
        return np.zeros((self.num_envs, 1)), np.zeros(self.num_envs), np.ones(self.num_envs, dtype=bool), infos


class _Scripted(EvalEnvs):
    def __init__(self, script: list[list[tuple[bool, bool]]]) -> None:
        super().__init__([None] * len(script))  # type: ignore[list-item]
        self.venv = _ScriptedEnvs(script)

    def get(self, k: int) -> Any:
        assert k == self.venv.num_envs
        return self.venv


class _Policy:
    def predict(self, obs: np.ndarray, deterministic: bool = True) -> tuple[np.ndarray, None]:
        return np.zeros((len(obs), 1)), None


def test_evaluate_scores_each_env_apart() -> None:
    """3 envs, 6 episodes (2 each): env 0 succeeds at the last step once of twice, env 1 never
    there (but at some step once), env 2 always."""
    t, f = True, False
    script = [[(t, t), (t, f)], [(t, f), (f, f)], [(t, t), (t, t)]]
    res = evaluate(_Policy(), _Scripted(script), 6)  # type: ignore[arg-type]
    assert res.n_episodes == 6
    assert res.env_success == (1.0, 0.5, 1.0) and res.env_success_last == (0.5, 0.0, 1.0)
    assert res.success == 5 / 6 and res.success_last == 0.5
    assert res.per_env() == {"success": [1.0, 0.5, 1.0], "success_last": [0.5, 0.0, 1.0]}


def test_own_per_env_round_trips_and_follows_the_task_list(tmp_path: Path) -> None:
    res = Results("cw10", "ppo", "topk", "crl", 0, ["a", "b", "c"], 100, finished_tasks=2, evaluated_tasks=2)
    assert res.own_per_env == [None, None, None]
    res.own_per_env[0] = {"success": [1.0, 0.0], "success_last": [1.0, 0.0]}
    res.save(tmp_path / "results.json")
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["own_per_env"] == [{"success": [1.0, 0.0], "success_last": [1.0, 0.0]}, None, None]
    again = Results.from_dict(data)
    assert again.own_per_env == res.own_per_env
    res.success_matrix[0][0], res.success_matrix[1] = 1.0, [0.0, 0.5, None]
    res.task_segments = [[0, 100], [100, 200]]
    assert res.head(1).own_per_env == [res.own_per_env[0]]
    del data["own_per_env"]  # a file from before it was recorded
    assert Results.from_dict(data).own_per_env == [None, None, None]
    again.extend(["a", "b", "c", "d"])
    assert len(again.own_per_env) == 4 and again.own_per_env[3] is None


class _PredictOnly:
    """The learner seen only through ``predict``: evaluation takes SB3's per-call path."""

    def __init__(self, model: Any) -> None:
        self.predict = model.predict


def test_an_evaluation_sets_the_policy_mode_once_and_scores_as_sb3s_predict(monkeypatch: Any) -> None:
    """SB3's ``predict`` walks the policy's modules to set the mode on every call; an evaluation
    sets it once, and its scores equal those of SB3's per-call path on the same envs."""
    from rl_moe.continual.agents import build_model
    from rl_moe.continual.resolve import RunRequest, resolve, suite_of
    from rl_moe.envs.factories import make_vec_env, task_factories

    cfg = resolve(RunRequest(suite="smoke", method="topk", tasks=1, steps_per_task=64, preset="tiny"))
    suite = suite_of(cfg)
    model = build_model(cfg, make_vec_env(task_factories(suite, suite.tasks[0], 1, 0), "dummy"), "cpu")
    factories = task_factories(suite, suite.tasks[0], 2, 5)
    policy_cls = type(model.policy)
    calls: list[bool] = []
    original = policy_cls.set_training_mode

    def counted(self: Any, mode: bool) -> None:
        calls.append(mode)
        original(self, mode)

    monkeypatch.setattr(policy_cls, "set_training_mode", counted)
    model.policy.set_training_mode(True)
    calls.clear()
    once = evaluate(model, factories, 4)
    assert calls == [False], f"the mode was set {len(calls)} times"
    assert not model.policy.training and "set_training_mode" not in vars(model.policy)
    per_call = evaluate(_PredictOnly(model), factories, 4)  # type: ignore[arg-type]
    assert len(calls) > 2 * 50  # SB3's path: once per step (smoke episodes are 200 steps)
    assert once == per_call and once.n_episodes == 4
    model.policy.set_training_mode(True)  # the method is the class's again
    assert model.policy.training and calls[-1] is True
