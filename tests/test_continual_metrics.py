"""Continual World metrics, results.json, config overrides, schedules and method networks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rl_moe.continual.agents import net_configs_for
from rl_moe.continual.config import RunConfig
from rl_moe.continual.learners import TaskLinearSchedule
from rl_moe.continual.metrics import compute_cl_metrics, curve_auc, forward_transfer
from rl_moe.continual.resolve import RunRequest, resolve
from rl_moe.atomic import write_json_atomic
from rl_moe.continual.results import Results
from rl_moe.errors import UsageError
from rl_moe.nn import build_network


def test_curve_auc_known_answers() -> None:
    assert curve_auc([0, 50, 100], [0.4, 0.4, 0.4], 0, 100) == pytest.approx(0.4)
    assert curve_auc([0, 100], [0.0, 1.0], 0, 100) == pytest.approx(0.5)  # linear ramp
    # Points outside the segment are ignored; the curve is held flat to the segment ends.
    assert curve_auc([50, 100, 150, 200], [9.0, 0.0, 1.0, 1.0], 100, 200) == pytest.approx(0.75)
    with pytest.raises(ValueError):
        curve_auc([0, 10], [1, 1], 20, 30)


def test_cl_metrics_brute_force() -> None:
    rng = np.random.default_rng(0)
    m = rng.uniform(size=(4, 4))
    own, final = np.diag(m), m[-1]
    res = compute_cl_metrics(own, final, [0.5, 0.2, 0.9, 1.0], [0.25, 0.6, 0.9, 1.0])
    assert res.average_performance == pytest.approx(final.mean())
    assert res.forgetting == pytest.approx(np.mean([own[i] - final[i] for i in range(4)]))
    # (0.5-.25)/.75, (0.2-.6)/.4, 0; the task with reference AUC 1 is left out.
    assert res.forward_transfer == pytest.approx(np.mean([1 / 3, -1.0, 0.0]))
    assert forward_transfer([0.3], [1.0]) is None
    assert compute_cl_metrics(own, final).forward_transfer is None
    # an unknown AUC (NaN, no eval inside the segment) leaves its task out instead of poisoning the mean
    assert forward_transfer([0.5, np.nan, 0.2], [0.25, 0.5, np.nan]) == pytest.approx(1 / 3)
    assert forward_transfer([np.nan], [0.5]) is None


def test_results_schema_incomplete_and_complete(tmp_path: Path) -> None:
    res = Results("smoke", "ppo", "topk", "crl", 0, ["a", "b"], 100)
    d = res.to_dict()
    assert d["schema"] == 1 and d["complete"] is False and d["success_matrix"] == [[None, None], [None, None]]
    assert d["final_success"] == [None, None] and d["cl_metrics"]["average_performance"] is None
    res.success_matrix = [[0.5, 0.0], [0.25, 1.0]]
    res.finished_tasks, res.evaluated_tasks, res.task_segments = 2, 2, [[0, 100], [100, 200]]
    res.eval_curves = {"a": {"steps": [0, 100], "success": [0.0, 0.5]}, "b": {"steps": [100, 200], "success": [0.0, 1.0]}}
    d = res.to_dict()
    assert d["own_success"] == [0.5, 1.0] and d["final_success"] == [0.25, 1.0]
    assert d["cl_metrics"]["average_performance"] == pytest.approx(0.625)
    assert d["cl_metrics"]["forgetting"] == pytest.approx(0.125)
    res.reference_aucs = [0.5, 0.0]
    assert res.cl_metrics()["forward_transfer"] == pytest.approx(np.mean([(0.25 - 0.5) / 0.5, 0.5]))
    path = tmp_path / "results.json"
    res.save(path)
    assert Results.from_dict(json.loads(path.read_text())).to_dict()["success_matrix"] == res.success_matrix
    write_json_atomic(path, {"x": 1})
    assert json.loads(path.read_text()) == {"x": 1} and [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_head_of_a_run_that_repeats_a_task() -> None:
    """The first n tasks of a longer run: a task that comes back later (CW20) keeps only the points
    of its kept segments, not its next start evaluation, logged at the step where the view ends."""
    res = Results("cw20", "ppo", "topk", "crl", 0, ["a", "b", "a"], 100, finished_tasks=3, evaluated_tasks=3)
    res.success_matrix = [[0.5, None, None], [0.25, 1.0, None], [0.75, 0.5, 1.0]]
    res.task_segments, res.global_step = [[0, 100], [100, 200], [200, 300]], 300
    res.eval_curves = {
        "a": {"steps": [0, 50, 100, 200, 300], "success": [0.0, 0.25, 0.5, 0.25, 1.0]},
        "b": {"steps": [100, 200], "success": [0.0, 1.0]},
    }
    res.provenance = [{"task": i, "from_step": 100 * i} for i in range(3)]
    head = res.head(2).to_dict()
    assert head["tasks"] == ["a", "b"] and head["complete"] and head["global_step"] == 200
    assert head["eval_curves"]["a"] == {"steps": [0, 50, 100], "success": [0.0, 0.25, 0.5]}
    assert head["eval_curves"]["b"] == res.eval_curves["b"]
    assert head["success_matrix"] == [[0.5, None], [0.25, 1.0]] and head["final_success"] == [0.25, 1.0]
    assert head["cl_metrics"]["forgetting"] == pytest.approx(0.125) and len(head["provenance"]) == 2
    assert res.head(3).to_dict() == res.to_dict()
    for bad, message in ((0, "1 <= n <= 3"), (4, "1 <= n <= 3")):
        with pytest.raises(ValueError, match=message):
            res.head(bad)
    res.task_segments = []
    with pytest.raises(ValueError, match="task segments"):
        res.head(2)
    res.task_segments, res.success_matrix[1][0] = [[0, 100], [100, 200], [200, 300]], None
    with pytest.raises(ValueError, match="full_matrix"):
        res.head(2)


def test_task_linear_schedule_is_task_local() -> None:
    # Task 2 of 1000 steps starting at global step 1000; SB3 progress is over [0, 2000].
    sched = TaskLinearSchedule(3e-4, 1e-4, 1.0, task_start=1000, task_steps=1000)
    assert sched(1 - 1000 / 2000) == pytest.approx(3e-4)
    assert sched(1 - 1500 / 2000) == pytest.approx(2e-4)
    assert sched(0.0) == pytest.approx(1e-4)
    half = TaskLinearSchedule(3e-4, 1e-4, 0.5, task_start=0, task_steps=1000)  # HumanoidBench
    assert half(1 - 250 / 1000) == pytest.approx(2e-4)
    assert half(1 - 500 / 1000) == pytest.approx(1e-4) == half(1 - 900 / 1000)


def test_overrides_and_presets_resolve() -> None:
    cfg = resolve(RunRequest(suite="cw10-cw", method="sphere", tasks=2, overrides=("ppo.n_steps=64", "net.hidden=32,32", "eval.full_matrix=false", "reg.sphere.rho=0.5")))
    assert cfg.ppo.n_steps == 64 and cfg.ppo.n_envs == 8 and cfg.ppo.batch_size == 256 and cfg.ppo.lr_start == 3e-4
    assert cfg.net.hidden == (32, 32) and cfg.eval.full_matrix is False and cfg.regularizers["sphere"].rho == 0.5
    assert cfg.tasks == ("hammer-v3", "push-wall-v3") and cfg.steps_per_task == 1_000_000
    again = RunConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg  # config.json round trip
    for bad, msg in [
        ("ppo.nsteps=3", "valid fields of ppo"),
        ("foo.bar=1", "valid choices"),
        ("ppo.n_steps=abc", "expected an int"),
        ("ppo.n_steps=1e400", "expected an int"),
        ("ppo.lr_start=inf", "expected a finite float"),
        ("ppo.gamma=5", "gamma must be in \\(0, 1\\]"),
        ("reg.sphere.rho=0.5", "this method does not use 'sphere'"),
        ("reg.nosuchreg.x=1", "unknown regularizer 'nosuchreg'"),
        ("ppo.n_steps=0", "must be > 0"),
        ("net.top_k=11", "top_k must be in"),
    ]:
        with pytest.raises(UsageError, match=msg):
            resolve(RunRequest(suite="cw10-cw", method="topk", overrides=(bad,)))


def test_method_networks() -> None:
    cfg = resolve(RunRequest(suite="smoke", method="dense10x", overrides=("net.hidden=32,32",)))
    nets = net_configs_for(cfg, 39, 4)
    assert nets.actor.kind == "mlp" and nets.actor.width_multiplier > 2.5 and nets.critic.width_multiplier == 1.0
    count = lambda c: sum(p.numel() for p in build_network(39, 4, c).parameters())
    base = count(net_configs_for(resolve(RunRequest(suite="smoke", method="dense", overrides=("net.hidden=32,32",))), 39, 4).actor)
    assert count(nets.actor) == pytest.approx(10 * base, rel=0.05)
    ln = net_configs_for(resolve(RunRequest(suite="smoke", method="ln")), 3, 1)
    assert ln.actor.layer_norm and ln.actor.kind == "topk" and not ln.critic.layer_norm and ln.critic.kind == "mlp"
    td3 = net_configs_for(resolve(RunRequest(suite="smoke", algo="td3", method="ds")), 3, 1)
    assert td3.actor.kind == "ds" and td3.critic.kind == "ds"  # TD3: MoE critics (SPHERE Table 22)


def test_periodic_eval_fires_at_rollout_boundaries() -> None:
    from rl_moe.continual.evaluation import EvalResult, PeriodicEval

    calls: list[int] = []
    curve: dict[str, list] = {"steps": [], "success": [], "return": []}

    class _Model:
        num_timesteps = 1000
        logger = type("L", (), {"record": lambda *a: None, "dump": lambda *a: None, "name_to_value": {}, "name_to_excluded": {}, "name_to_count": {}})()

    model = _Model()
    cb = PeriodicEval(lambda: (calls.append(cb.num_timesteps), EvalResult(0.5, -1.0, 2))[1], every=100, task_end=1600, curve=curve)
    cb.init_callback(model)  # type: ignore[arg-type]
    cb.on_training_start({}, {})
    for boundary in (1064, 1128, 1350, 1400, 1600):  # rollout starts (global steps)
        model.num_timesteps = boundary
        cb.on_rollout_start()
    assert calls == [1000, 1128, 1350, 1400]  # due points 1100, 1200(->1350 jumps 1300), 1400; none at the task end
    assert curve["steps"] == calls and curve["success"] == [0.5] * 4


def test_progress_line_draws_bar_counts_and_newline() -> None:
    import io

    from rl_moe.continual.progress import ProgressLine

    out = io.StringIO()
    line = ProgressLine("[task 1/2 a]", task_start=1000, task_steps=200, stream=out, interval=0.0)
    line.model = None  # type: ignore[assignment]  # SB3 sets it in init_callback
    line.num_timesteps = 1000
    line._on_training_start()
    assert out.getvalue().rstrip().endswith("ETA ?")  # nothing done yet: no rate, no ETA
    line.num_timesteps = 1050
    line._on_step()
    last = out.getvalue().split("\r")[-1]
    assert last.startswith("[task 1/2 a] [######------------------]") and "50/200" in last
    line.num_timesteps = 1300  # past the budget (PPO rounds up): capped at the task's steps
    line._on_training_end()
    last = out.getvalue().split("\r")[-1]
    assert "[########################]" in last and "200/200" in last and last.endswith("\n")


class _Clock:
    """A fake clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _line(clock: _Clock, start: int = 0, **kw: object):  # type: ignore[no-untyped-def]
    import io
    import types

    from rl_moe.continual.progress import ProgressLine

    line = ProgressLine("[task 1/3 a]", task_start=start, task_steps=100, stream=io.StringIO(), interval=0.0, clock=clock, **kw)  # type: ignore[arg-type]
    line.model = types.SimpleNamespace(num_timesteps=start)  # type: ignore[assignment]
    line.num_timesteps = start
    line._on_training_start()
    return line


def _rollout(line, clock: _Clock, steps: int, seconds: float) -> None:  # type: ignore[no-untyped-def]
    line._on_rollout_start()
    clock.t += seconds
    line.num_timesteps += steps
    line._on_step()
    line._on_rollout_end()


def test_progress_eta_adds_rollouts_and_updates_each_at_its_own_rate() -> None:
    from rl_moe.continual.progress import hms

    from rl_moe.continual.progress import Pace

    clock = _Clock()
    line = _line(clock, later_steps=200, later_tasks=2, pace=Pace(tail_seconds=2.0))
    _rollout(line, clock, 50, 1.0)  # 50 steps in 1 s: 0.02 s per step
    clock.t += 4.0  # a 4 s update
    line._on_rollout_start()
    # 50 + 200 steps at 0.02 s, 1 + 2 x 2 updates of 50-step rollouts at 4 s, 3 task ends at 2 s
    assert line.estimate() == (pytest.approx(250 * 0.02 + 5 * 4.0 + 3 * 2.0), True)
    assert line.steps_per_second == pytest.approx(10.0)  # 50 steps per 5 s cycle
    clock.t += 0.25  # half of the next rollout, at twice the rate: the rollout in progress counts at once
    line.num_timesteps += 25
    assert line.estimate()[0] == pytest.approx(225 * 1.25 / 75 + 5 * 4.0 + 3 * 2.0)
    assert hms(25.0) == "0:00:25" and hms(3 * 3600 + 62.4) == "3:01:02" and hms(float("nan")) == "?"


def test_progress_eta_is_a_lower_bound_until_an_update_is_timed_and_moves_during_the_first() -> None:
    from rl_moe.continual.progress import Pace, Phases

    import io
    import types

    from rl_moe.continual.progress import ProgressLine

    clock = _Clock()
    line = ProgressLine("[task 1/3 a]", 0, 100, stream=io.StringIO(), interval=0.0, later_steps=200, later_tasks=2, tail_per_start_eval=4.0, clock=clock)
    line.model = types.SimpleNamespace(num_timesteps=0)  # type: ignore[assignment]
    line.num_timesteps = 0
    clock.t += 1.5  # the task-start evaluation: a task's end (4x its episodes) is guessed at 6 s
    line._on_training_start()
    assert line.stream.getvalue().rstrip().endswith("run ETA ?")  # nothing timed yet: a fraction of a second
    line._on_rollout_start()
    clock.t += 1.0
    line.num_timesteps = 50
    line._on_step()
    assert line.estimate() == (pytest.approx(250 * 0.02 + 3 * 6.0), False)
    # the steps are timed, the updates not: no number, which would be a third of the time left
    assert line.stream.getvalue().rstrip().endswith("run ETA after the first update")
    line._on_rollout_end()
    clock.t += 2.0
    line.on_epoch(2, 10)  # 2 of 10 epochs done in 2 s: a 10 s update, 8 s of it left
    assert line.estimate() == (pytest.approx(250 * 0.02 + 8.0 + 5 * 10.0 + 3 * 6.0), True)
    assert line.stream.getvalue().rstrip().endswith("run ETA 0:01:21  update 3/10")
    # the next task starts from this one's phases, and counts the end-of-task work
    clock.t += 8.0
    line._on_training_end()
    assert (line.phases.rollout_steps, line.phases.updates, line.phases.update_seconds, line.phases.rollout_size) == (50, 1, 10.0, 50)
    nxt = _line(clock, start=100, later_steps=100, later_tasks=1, pace=Pace(line.phases, tail_seconds=7.0))
    assert nxt.estimate() == (pytest.approx(200 * 0.02 + 4 * 10.0 + 2 * 7.0), True)  # a timed tail replaces the guess
    assert isinstance(nxt.pace.phases, Phases)
    assert not _line(clock).estimate()[1]  # no tail timed nor guessed: a lower bound


def test_the_end_of_task_evaluation_shows_its_progress() -> None:
    import io

    from rl_moe.continual.progress import draw_evaluation

    out = io.StringIO()
    for k in range(4):
        draw_evaluation("[task 3/3 c]", k, 3, out)
    frames = out.getvalue().split("\r")[1:]
    assert [f.strip() for f in frames] == [f"[task 3/3 c] evaluating {k}/3 tasks" for k in range(4)]
    assert out.getvalue().endswith("\n") and out.getvalue().count("\n") == 1


def test_progress_line_shows_the_update_epoch_and_counts_the_end_of_task_work() -> None:
    import io

    from stable_baselines3.common.env_util import make_vec_env

    from rl_moe.algos import MoEPPO
    from rl_moe.continual.progress import ProgressLine

    class Recording(ProgressLine):
        def on_epoch(self, epoch: int, n_epochs: int) -> None:
            super().on_epoch(epoch, n_epochs)
            shown.append(out.getvalue().split("\r")[-1].rstrip())

    shown: list[str] = []
    out = io.StringIO()
    model = MoEPPO("MlpPolicy", make_vec_env("Pendulum-v1", n_envs=1, seed=0), n_steps=64, batch_size=32, n_epochs=3, seed=0, device="cpu")
    line = Recording("[task 1/2 a]", task_start=0, task_steps=128, stream=out, interval=60.0)
    model.learn(128, callback=line)
    assert [line[-10:] for line in shown] == [f"update {k}/3" for k in (1, 2, 3, 1, 2, 3)]  # 2 updates x 3 epochs
    assert model.on_epoch is None  # handed back at the end of training
    assert "update" not in out.getvalue().split("\r")[-1]  # the final line shows no stale phase
    assert (line.phases.rollout_steps, line.phases.updates, line.phases.rollout_size) == (128, 2, 64)


def test_an_interrupted_progress_line_shows_the_saved_step_not_the_reached_one() -> None:
    import io
    import types

    from rl_moe.continual.progress import ProgressLine

    clock = _Clock()
    line = ProgressLine("[task 2/3 b]", 1000, 400, stream=io.StringIO(), interval=0.0, clock=clock)
    line.model = types.SimpleNamespace(num_timesteps=1000)  # type: ignore[assignment]
    line.num_timesteps = 1000
    line._on_training_start()
    line._on_rollout_start()
    clock.t += 1.0
    line.num_timesteps = 1150  # mid-rollout when the signal came; the last boundary written was 1128
    line._on_step()
    assert "      150/400" in line.stream.getvalue().split("\r")[-1]
    line.stopped(1128)
    last = line.stream.getvalue().split("\r")[-1]
    assert "      128/400" in last and last.rstrip().endswith("run ETA stopped (saved at this step)")
