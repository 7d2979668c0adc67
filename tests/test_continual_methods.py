"""Every ``--method`` builds its network + regularizers and trains a few steps with PPO and TD3."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rl_moe.continual.agents import begin_task, build_model
from rl_moe.continual.methods import METHODS
from rl_moe.continual.resolve import RunRequest, resolve, suite_of
from rl_moe.envs.factories import make_vec_env, task_factories
from rl_moe.nn import NetConfig
from rl_moe.regularizers import SphereConfig


def _model(method: str, algo: str):
    cfg = resolve(RunRequest(suite="smoke", algo=algo, method=method, tasks=1, steps_per_task=64, preset="tiny"))
    suite = suite_of(cfg)
    env = make_vec_env(task_factories(suite, suite.tasks[0], 1 if algo == "td3" else cfg.ppo.n_envs, 0), "dummy")
    return cfg, build_model(cfg, env, "cpu")


@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_trains_with_ppo(method: str) -> None:
    cfg, model = _model(method, "ppo")
    spec = METHODS[method]
    assert model.policy.actor_cfg.kind == spec.kind and model.policy.actor_cfg.layer_norm == spec.layer_norm
    assert model.policy.critic_cfg == NetConfig(kind="mlp", n_experts=4, hidden=(32, 32), gate_hidden=(16,))
    from rl_moe.regularizers import REGISTRY

    assert [type(r) for r in model.regularizers] == [REGISTRY[n] for n in spec.regularizers]
    before = [p.detach().clone() for p in model.policy.parameters()]
    begin_task(model, cfg, 0, 0)
    model.learn(128, reset_num_timesteps=False)
    assert model.num_timesteps == 128
    assert any(not torch.equal(a, b) for a, b in zip(before, model.policy.parameters()))


def test_td3_sphere_regularizes_critic() -> None:
    cfg, model = _model("sphere", "td3")
    # Stored whole (every field, defaults filled in): a resumed run cannot pick up a changed default.
    assert cfg.regularizers["sphere"] == SphereConfig(placement="critic", rho=0.1)
    assert cfg.to_dict()["regularizers"]["sphere"] == {**dataclasses.asdict(SphereConfig()), "placement": "critic", "rho": 0.1}
    assert model.policy.critic_cfg.kind == "topk" and model.policy.actor_cfg.kind == "topk"
    begin_task(model, cfg, 0, 0)
    assert model.learning_starts == cfg.td3.learning_starts
    model.learn(160, reset_num_timesteps=False)
    assert model.replay_buffer.size() == 160
    begin_task(model, cfg, 1, 160)  # new task: buffer emptied, warm-up restarts at the global step
    assert model.replay_buffer.size() == 0 and model.learning_starts == 160 + cfg.td3.learning_starts


def test_unlisted_routers_and_regularizers_get_default_methods() -> None:
    from rl_moe.continual.methods import Method, _defaults
    from rl_moe.nn.routing import ROUTERS
    from rl_moe.regularizers import REGISTRY

    derived = _defaults({})
    assert set(derived) == set(ROUTERS) | set(REGISTRY)
    assert derived["expert_choice"].kind == "expert_choice" and derived["expert_choice"].regularizers == ()
    assert derived["redo"].kind == "topk" and derived["redo"].regularizers == ("redo",)
    assert derived["redo"].description.startswith("Top-K MoE + dormant-neuron recycling")
    named = {"ec": Method("ec", "expert_choice"), "redo": Method("redo", "dense_moe", regularizers=("redo",))}
    assert "expert_choice" not in _defaults(named) and "redo" not in _defaults(named)
    assert set(_defaults(METHODS)) == set()


def test_config_json_stores_every_regularizer_field(tmp_path) -> None:
    # Every field present (defaults filled in) means a resumed run is rebuilt from what it ran
    # with, whatever the defaults of a later version.
    import json

    from rl_moe.continual.config import RunConfig
    from rl_moe.continual.methods import build_regularizers

    cfg = resolve(RunRequest(suite="smoke", method="sphere", tasks=1, device="cpu", overrides=("reg.sphere.rho=0.05",)))
    cfg.save(str(tmp_path / "config.json"))
    stored = json.loads((tmp_path / "config.json").read_text())["regularizers"]["sphere"]
    assert set(stored) == {f.name for f in dataclasses.fields(SphereConfig)}
    assert stored == dataclasses.asdict(SphereConfig(rho=0.05))
    (reg,) = build_regularizers(("sphere",), RunConfig.from_dict(json.loads((tmp_path / "config.json").read_text())).regularizers)
    assert reg.config == SphereConfig(**stored)


def test_stored_regularizer_fields_win_over_todays_defaults_and_unused_entries_are_dropped() -> None:
    from rl_moe.continual.config import RunConfig

    cfg = resolve(RunRequest(suite="smoke", method="sphere", tasks=1, device="cpu"))
    data = cfg.to_dict()
    # A run written by a version whose defaults differed, with a setting its method never used.
    data["regularizers"]["sphere"] = {**data["regularizers"]["sphere"], "eps": 1e-5, "rank_every": 7}
    data["regularizers"]["redo"] = {"tau": 0.5}
    loaded = RunConfig.from_dict(data)
    assert set(loaded.regularizers) == {"sphere"}
    assert loaded.regularizers["sphere"] == dataclasses.replace(SphereConfig(rho=0.1), eps=1e-5, rank_every=7)


def test_a_bad_suite_regularizer_setting_is_refused_even_when_the_method_does_not_use_it(tmp_path) -> None:
    import json

    from rl_moe.errors import UsageError
    from rl_moe.envs.suites import load_suite

    data = load_suite("smoke").to_dict()
    data["name"], data["regularizers"] = "smoke-typo", {"sphere": {"rhoo": 0.1}}
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError, match="bad settings for regularizer 'sphere': unknown sphere option 'rhoo'; valid choices: rho, "):
        resolve(RunRequest(suite=str(path), method="topk", tasks=1, device="cpu"))


def test_sphere_guard_is_sphere_with_the_scale_invariant_penalty() -> None:
    from rl_moe.continual.resolve import RunRequest, resolve

    guard = resolve(RunRequest(suite="cw10-cw", method="sphere_guard", tasks=1))
    paper = resolve(RunRequest(suite="cw10-cw", method="sphere", tasks=1))
    assert guard.regularizers["sphere"].scale_invariant and not paper.regularizers["sphere"].scale_invariant
    assert guard.regularizers["sphere"].rho == paper.regularizers["sphere"].rho == 0.1  # the suite's rho
    assert not resolve(RunRequest(suite="cw10-cw", method="sphere_guard", tasks=1, overrides=("reg.sphere.scale_invariant=false",))).regularizers["sphere"].scale_invariant
