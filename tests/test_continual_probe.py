"""The held-out probe batch: scripted-expert and random rollouts, and the probe.policy setting."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rl_moe.continual.config import RunConfig
from rl_moe.continual.probe_states import collect_probe_states
from rl_moe.continual.resolve import RunRequest, resolve
from rl_moe.crl import main
from rl_moe.diagnostics import ProbeConfig
from rl_moe.envs.factories import EnvFactory
from rl_moe.envs.families import metaworld_expert, metaworld_names
from rl_moe.envs.suites import TaskSpec
from rl_moe.errors import UsageError


def test_every_metaworld_task_has_a_scripted_expert() -> None:
    for task in metaworld_names():
        assert callable(metaworld_expert(task).get_action), task
    with pytest.raises(ValueError, match="no scripted policy"):
        metaworld_expert("fly-to-moon-v3")


def test_expert_probe_states_reach_the_goal_and_random_ones_do_not() -> None:
    # reach-v3 observations: hand position in [0:3], goal position in [-3:].
    factory = EnvFactory("metaworld", TaskSpec("reach-v3"), 200, "info", 99)
    dist, batches = {}, {}
    for policy in ("expert", "random"):
        states = batches[policy] = collect_probe_states([factory], 120, stride=5, policy=policy, seed=0).numpy()
        assert states.shape == (120, 39) and np.isfinite(states).all()
        dist[policy] = np.linalg.norm(states[:, :3] - states[:, -3:], axis=1)
    # The scripted reacher spends most of each episode at the goal; random actions wander.
    assert np.median(dist["expert"]) < 0.05 < np.median(dist["random"])
    # Same seed, same batch; the action noise comes from that seed.
    np.testing.assert_array_equal(collect_probe_states([factory], 120, stride=5, policy="expert", seed=0).numpy(), batches["expert"])
    assert not np.array_equal(collect_probe_states([factory], 120, stride=5, policy="expert", seed=1).numpy(), batches["expert"])


def test_probe_batch_is_split_over_the_probe_tasks_in_order() -> None:
    tasks = ("reach-v3", "door-open-v3", "plate-slide-v3")
    factories = [EnvFactory("metaworld", TaskSpec(t), 200, "info", 99 + i) for i, t in enumerate(tasks)]
    states = collect_probe_states(factories, 31, stride=20, policy="expert", seed=0)
    assert states.shape == (31, 39)
    # Shares 11/10/10, task by task: each share equals that task's batch collected alone.
    for factory, (lo, hi) in zip(factories, [(0, 11), (11, 21), (21, 31)]):
        alone = collect_probe_states([factory], hi - lo, stride=20, policy="expert", seed=0)
        np.testing.assert_array_equal(states[lo:hi].numpy(), alone.numpy())


def test_cw10_probe_batch_spans_more_than_one_task_and_lifts_the_fresh_entk_rank() -> None:
    # A fresh network on the one-task batch of earlier versions (reach-v3) had r_e(K) ~1.2-2, the
    # same as a trained one; the eight held-out tasks vary in more dimensions and give a
    # kernel of clearly higher rank (docs/metrics.md, "The held-out batch").
    import torch

    from rl_moe.envs.suites import load_suite
    from rl_moe.diagnostics import entk_rank
    from rl_moe.diagnostics.views import NetView
    from rl_moe.nn import NetConfig, build_network

    suite = load_suite("cw10-cw")
    assert len(suite.probe_tasks) >= 4 and not set(t.name for t in suite.probe_tasks) & set(suite.task_names)
    cfg = ProbeConfig()
    factories = [EnvFactory("metaworld", t, 200, "info", 99 + i) for i, t in enumerate(suite.probe_tasks)]
    mixed = collect_probe_states(factories, 256, stride=cfg.stride, policy="expert", noise=cfg.noise, seed=0)
    single = collect_probe_states([EnvFactory("metaworld", TaskSpec("reach-v3"), 200, "info", 99)], 256, stride=5, policy="expert", noise=0.1, seed=0)
    varying = lambda x: int((x.std(0) > 1e-3).sum())  # noqa: E731
    assert varying(mixed) >= 22 > varying(single)
    ranks = {"mixed": [], "single": []}
    for seed in range(3):
        torch.manual_seed(seed)
        net = build_network(39, 4, NetConfig(kind="topk"))
        view = NetView(module=net, inputs=lambda o: o, is_moe=True)
        ranks["mixed"].append(entk_rank(view, mixed))
        ranks["single"].append(entk_rank(view, single))
    assert np.mean(ranks["mixed"]) > 2 * np.mean(ranks["single"]), ranks


def test_probe_policy_auto_resolves_per_family() -> None:
    assert resolve(RunRequest(suite="cw10-cw", tasks=1, device="cpu")).probe.policy == "expert"
    assert resolve(RunRequest(suite="smoke", tasks=1, device="cpu")).probe.policy == "random"
    assert resolve(RunRequest(suite="cw10-cw", tasks=1, device="cpu", overrides=("probe.policy=random",))).probe.policy == "random"


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("probe.policy=expert", "needs scripted experts"),
        ("probe.policy=oracle", "valid choices: auto, expert, random"),
        ("probe.noise=-0.5", "probe.noise must be >= 0"),
        ("probe.every=-1", "probe.every must be >= 0"),
    ],
)
def test_bad_probe_settings_exit_2(setting: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "runs"
    assert main(["--suite", "smoke", "--tasks", "1", "--set", setting, "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not out.exists()


def test_probe_section_is_the_diagnostics_config_and_old_runs_load() -> None:
    cfg = resolve(RunRequest(suite="smoke", tasks=1, device="cpu", overrides=("probe.spectral_every=0", "probe.online=true")))
    assert isinstance(cfg.probe, ProbeConfig) and cfg.probe.spectral_every == 0 and cfg.probe.online
    # config.json of a run made before the sections were merged: the same five keys.
    data = cfg.to_dict()
    data["probe"] = {"enabled": True, "n_states": 64, "every": 0, "policy": "random", "noise": 0.1}
    assert RunConfig.from_dict(data).probe == ProbeConfig(n_states=64, policy="random", noise=0.1)
    assert RunConfig.from_dict(cfg.to_dict()) == cfg  # the nested SLQ settings round-trip too
    with pytest.raises(UsageError, match="valid fields of probe"):
        resolve(RunRequest(suite="smoke", tasks=1, device="cpu", overrides=("probe.slq=4",)))
    with pytest.raises(UsageError, match="probe.knn must be >= 1, got 0"):
        resolve(RunRequest(suite="smoke", tasks=1, device="cpu", overrides=("probe.knn=0",)))
