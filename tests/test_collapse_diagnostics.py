"""The collapse and action-box diagnostics: SPHERE's per-update collapse flag and feature-trace
ratio, and the share of the policy's action mean outside its box (docs/results.md, "Definitions")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.td3.policies import TD3Policy

from rl_moe.diagnostics.action_box import mean_outside_box
from rl_moe.regularizers.sphere import COLLAPSE_COEF, COLLAPSE_LOSS, Sphere, is_collapsed
from tests.test_diagnostics_probe import read_scalars


def _policy(bias: list[float], low: float = -1.0, high: float = 1.0) -> ActorCriticPolicy:
    obs = spaces.Box(-np.inf, np.inf, (3,), np.float32)
    act = spaces.Box(low, high, (len(bias),), np.float32)
    policy = ActorCriticPolicy(obs, act, lambda _: 1e-3)
    with torch.no_grad():
        policy.action_net.weight.zero_()
        policy.action_net.bias.copy_(torch.tensor(bias))
    return policy


def test_mean_outside_box_counts_the_entries_past_either_bound() -> None:
    obs = torch.randn(16, 3)
    assert mean_outside_box(_policy([2.0, 0.5, -3.0, 0.0]), obs, spaces.Box(-1, 1, (4,))) == 0.5
    assert mean_outside_box(_policy([1.0, -1.0]), obs, spaces.Box(-1, 1, (2,))) == 0.0  # on the bound is inside
    assert mean_outside_box(_policy([1.5, -2.5]), obs, spaces.Box(-2, 2, (2,))) == 0.5  # the space's own bounds
    td3 = TD3Policy(spaces.Box(-np.inf, np.inf, (3,)), spaces.Box(-1, 1, (2,)), lambda _: 1e-3)
    assert mean_outside_box(td3, obs, spaces.Box(-1, 1, (2,))) is None  # no distribution: nothing to say


@pytest.mark.parametrize(
    ("coef", "loss", "collapsed"),
    [(2 * COLLAPSE_COEF, 1.0, True), (10.0, COLLAPSE_LOSS / 10, True), (10.0, 0.0, True), (10.0, 0.1, False), (COLLAPSE_COEF, COLLAPSE_LOSS, False)],
)
def test_an_update_is_collapsed_by_lambda_or_by_the_penalty(coef: float, loss: float, collapsed: bool) -> None:
    assert is_collapsed(coef, loss) == collapsed
    reg = Sphere()
    reg.logged({"train/coef_sphere": coef, "train/loss_sphere": loss, "train/loss_sphere_gate": 5.0})
    assert reg.logs()["sphere_collapsed"] == float(collapsed)


def test_a_sphere_run_logs_collapse_trace_and_action_box(tmp_path: Path) -> None:
    from rl_moe.crl import main

    run = tmp_path / "run"
    argv = ["--suite", "smoke", "--method", "sphere", "--tasks", "1", "--steps-per-task", "1024", "--preset", "tiny", "--no-progress",
            "--run-dir", str(run), "--set", "probe.online=true"]  # fmt: skip
    assert main(argv) == 0
    scalars = read_scalars(run / "tb")
    flags = [v for _, v in scalars["train/sphere_collapsed"]]
    assert len(flags) >= 3 and set(flags) <= {0.0, 1.0}
    ratios = [v for _, v in scalars["train/sphere_trace_ratio"]]
    traces = [v for _, v in scalars["train/sphere_trace"]]
    assert all(r > 0 for r in ratios)
    fresh = traces[0] / ratios[0]  # one baseline for the run: the fresh network's (tests/test_sphere.py)
    assert ratios == pytest.approx([t / fresh for t in traces])
    for tag in ("policy/mean_outside_box", "policy/mean_outside_box_online"):
        assert scalars[tag] and all(0.0 <= v <= 1.0 for _, v in scalars[tag]), tag


def test_the_report_reads_collapse_from_old_and_new_logs_per_task_segment() -> None:
    from rl_moe.report.collapse import collapse_flags, run_row, segment_mean
    from rl_moe.report.runs import Run, RunKey
    from rl_moe.report.scalars import Curve

    steps = np.array([100.0, 200.0, 300.0, 400.0])
    # an old run: lambda and the penalty only (updates 2 and 4 collapsed: by lambda, by the penalty)
    old = {"train/coef_sphere": Curve(steps, np.array([5.0, 2e5, 7.0, 0.0])), "train/loss_sphere": Curve(steps, np.array([0.1, 0.1, 0.2, 0.0]))}
    flags = collapse_flags(old)
    assert flags is not None and flags.values.tolist() == [0.0, 1.0, 0.0, 1.0]
    assert collapse_flags({}) is None
    # a task segment owns (start, end]: its boundary step is the earlier task's last update
    assert segment_mean(flags, 0, 200) == 0.5 and segment_mean(flags, 200, 400) == 0.5 and segment_mean(flags, 400, 500) != segment_mean(flags, 400, 500)
    new = {"train/sphere_collapsed": Curve(steps, np.array([1.0, 1.0, 1.0, 0.0])), "policy/mean_outside_box": Curve(np.array([200.0, 400.0]), np.array([0.25, 0.75]))}
    # r_e(K): the segment's last probe (probes at 150 and 200 in the first segment, 350 in the second)
    new["plasticity/entk_rank"] = Curve(np.array([150.0, 200.0, 350.0]), np.array([7.0, 5.5, 3.25]))
    run = Run(Path("r"), RunKey("s", "ppo", "sphere", "crl"), 0, ("a", "b"), 200, True, (1.0, 0.0), (1.0, 0.0), ((1.0, 0.0), (1.0, 0.0)), segments=((0, 200), (200, 400)))
    assert run_row(run, new) == ["1.00 / 100% / 25% / 5.50", "0.00 / 50% / 75% / 3.25"]
    assert run_row(run, {}) == ["1.00 / — / — / —", "0.00 / — / — / —"]
    # a run inside its second task: that task's probes so far are not its segment's last
    unfinished = Run(Path("r"), RunKey("s", "ppo", "sphere", "crl"), 0, ("a", "b"), 200, False, (1.0, float("nan")), (float("nan"),) * 2, ((1.0, float("nan")), (float("nan"),) * 2), segments=((0, 200),))
    assert run_row(unfinished, new) == ["1.00 / 100% / 25% / 5.50", "— / — / — / —"]
