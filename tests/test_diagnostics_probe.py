"""PlasticityProbe inside real SB3 training, read back from TensorBoard event files."""

import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from stable_baselines3 import PPO, TD3
from stable_baselines3.common.logger import configure
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rl_moe.diagnostics import (
    PROBE_FILE,
    PlasticityProbe,
    ProbeConfig,
    SlqConfig,
    collect_states,
)
from rl_moe.policies import MoEActorCriticPolicy, MoETD3Policy
from tests.conftest import NETS

CORE_TAGS = (
    "plasticity/entk_rank",
    "plasticity/feature_rank",
    "plasticity/feature_cond",
    "plasticity/dormant_ratio",
    "plasticity/feature_norm",
    "plasticity/grad_norm",
)
TINY_MOE = NETS["tiny"]


def read_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def tiny_ppo(policy, run_dir: Path, **policy_kwargs) -> PPO:
    model = PPO(policy, "Pendulum-v1", n_steps=64, batch_size=32, n_epochs=1, seed=0, policy_kwargs=policy_kwargs or None)
    model.set_logger(configure(str(run_dir), ["tensorboard"]))
    return model


def test_probe_logs_real_tensorboard_scalars_and_reuses_states(tmp_path: Path) -> None:
    cfg = ProbeConfig(
        every=64, n_states=32, spectral_every=64, slq_every=128, coupling_every=128, online=True, slq=SlqConfig(2, 5)
    )
    model = tiny_ppo(MoEActorCriticPolicy, tmp_path, moe="topk", **TINY_MOE)
    model.learn(192, callback=PlasticityProbe(tmp_path, config=cfg))
    scalars = read_scalars(tmp_path)
    for tag in (*CORE_TAGS, "plasticity/critic_entk_rank", "routing/overlap", "routing/silhouette", "routing/entropy"):
        assert [s for s, _ in scalars[tag]] == [64, 128, 192], tag
        assert all(math.isfinite(v) for _, v in scalars[tag]), tag
    for tag in ("spectral/sdmoe_param_sim_in", "spectral/mso_weight", "spectral/ssmoe_topk_overlap", "plasticity/entk_rank_online"):
        assert len(scalars[tag]) == 3, tag
    assert [s for s, _ in scalars["spectral/gn_coupling"]] == [64, 192]
    assert [s for s, _ in scalars["plasticity/entk_rank_slq"]] == [64, 192]
    ranks = [v for _, v in scalars["plasticity/entk_rank"]]
    assert all(1.0 <= r <= 32 for r in ranks)
    assert all(0.0 <= v <= 1.0 for _, v in scalars["plasticity/dormant_ratio"])

    saved = torch.load(tmp_path / PROBE_FILE)
    assert saved.shape == (32, 3)
    # A dense MlpPolicy on the same run folder probes the very same states; no MoE-only tags.
    dense_dir = tmp_path / "dense"
    dense_dir.mkdir()
    (dense_dir / PROBE_FILE).write_bytes((tmp_path / PROBE_FILE).read_bytes())
    probe = PlasticityProbe(dense_dir, config=ProbeConfig(every=64, n_states=32, spectral_every=64))
    tiny_ppo("MlpPolicy", dense_dir).learn(64, callback=probe)
    assert torch.equal(probe.states, saved)
    dense = read_scalars(dense_dir)
    assert set(CORE_TAGS) <= set(dense)
    assert not any(t.startswith(("routing/", "spectral/")) for t in dense)


@pytest.mark.parametrize("policy", ["MlpPolicy", MoETD3Policy])
def test_probe_with_td3(tmp_path: Path, policy) -> None:
    kwargs = {"net_arch": [16, 16]} if policy == "MlpPolicy" else {"moe": "topk", "critic_moe": True, **TINY_MOE}
    model = TD3(policy, "Pendulum-v1", learning_starts=32, train_freq=16, seed=0, policy_kwargs=kwargs)
    model.set_logger(configure(str(tmp_path), ["tensorboard"]))
    probe = PlasticityProbe(tmp_path, config=ProbeConfig(every=32, n_states=16, spectral_every=32))
    model.learn(96, callback=probe)
    assert set(CORE_TAGS) <= set(probe.last_values)
    assert "plasticity/critic_entk_rank" in probe.last_values
    assert probe.states.shape == (16, 3)
    assert ("routing/overlap" in probe.last_values) == (policy is MoETD3Policy)
    assert ("spectral/sdmoe_grad_sim_in" in probe.last_values) == (policy is MoETD3Policy)


def test_probe_on_held_out_metaworld_states(tmp_path: Path) -> None:
    pytest.importorskip("metaworld")
    held_out = collect_states(gym.make("Meta-World/MT1", env_name="reach-v3", seed=0), 48, seed=0)  # not in CW10
    env = gym.make("Meta-World/MT1", env_name="push-v3", seed=0)
    model = PPO(MoEActorCriticPolicy, env, n_steps=64, batch_size=32, n_epochs=1, seed=0, policy_kwargs=dict(moe="ds", **TINY_MOE))
    model.set_logger(configure(str(tmp_path), ["tensorboard"]))
    probe = PlasticityProbe(tmp_path, states=held_out, config=ProbeConfig(every=64, n_states=48, spectral_every=64))
    model.learn(64, callback=probe)
    assert torch.equal(torch.load(tmp_path / PROBE_FILE), held_out)
    scalars = read_scalars(tmp_path)
    assert set(CORE_TAGS) <= set(scalars)
    assert 1.0 <= scalars["plasticity/entk_rank"][0][1] <= 48


def test_probe_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="probe.n_states must be >= 1, got 0"):
        ProbeConfig(n_states=0)
    with pytest.raises(ValueError, match="probe.slq_every must be >= 0"):
        ProbeConfig(slq_every=-1)
    # every=0 means "at every periodic evaluation": only a continual run can resolve it.
    with pytest.raises(ValueError, match="probe.every >= 1"):
        PlasticityProbe(config=ProbeConfig(every=0))


def test_collect_states_is_reproducible_per_seed() -> None:
    def batch(seed: int, **kwargs) -> np.ndarray:
        return collect_states(gym.make("Pendulum-v1"), 40, seed, **kwargs).numpy()

    assert batch(0).shape == (40, 3)
    np.testing.assert_array_equal(batch(0), batch(0))
    assert not np.array_equal(batch(0), batch(1))
    # stride keeps every k-th state of the same rollout.
    np.testing.assert_array_equal(batch(0, stride=2)[:20], batch(0)[::2])


def test_probe_does_not_change_training(tmp_path: Path) -> None:
    def train(probe: PlasticityProbe | None) -> dict[str, torch.Tensor]:
        model = tiny_ppo(MoEActorCriticPolicy, tmp_path / ("on" if probe else "off"), moe="topk", **TINY_MOE)
        model.learn(128, callback=probe)
        return model.policy.state_dict()

    cfg = ProbeConfig(every=64, n_states=32, spectral_every=64, coupling_every=64)
    with_probe, without = train(PlasticityProbe(tmp_path / "on", config=cfg)), train(None)
    assert all(torch.equal(with_probe[k], without[k]) for k in without)


def test_a_failing_metric_family_drops_only_itself_and_warns_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import rl_moe.diagnostics.probe as probe_module

    def broken(*args, **kwargs):
        raise RuntimeError("element 0 of tensors does not require grad")

    monkeypatch.setattr(probe_module, "spectral_group", broken)
    cfg = ProbeConfig(every=64, n_states=32, spectral_every=64)
    model = tiny_ppo(MoEActorCriticPolicy, tmp_path, moe="topk", **TINY_MOE)
    with pytest.warns(RuntimeWarning, match="the spectral metrics failed") as caught:
        model.learn(192, callback=PlasticityProbe(tmp_path, config=cfg))
    assert sum("spectral metrics failed" in str(w.message) for w in caught) == 1
    scalars = read_scalars(tmp_path)
    for tag in (*CORE_TAGS, "routing/entropy", "plasticity/entk_rank_online", "plasticity/idle_expert_fraction"):
        assert [s for s, _ in scalars[tag]] == [64, 128, 192], tag
    assert not any(t.startswith("spectral/") for t in scalars)
