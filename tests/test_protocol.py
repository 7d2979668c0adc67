"""The MetaWorld protocol as named choices: position rules (real envs), suite task and eval
defaults, the evaluation views (training envs' positions, held-out ones, success at the last step)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rl_moe.continual.evaluation import EvalPoint, EvalResult, append_point
from rl_moe.continual.resolve import RunRequest, check_suite_settings, resolve
from rl_moe.continual.rng import env_seed
from rl_moe.continual.scheduler import ContinualScheduler
from rl_moe.crl import main
from rl_moe.envs.factories import task_factories
from rl_moe.envs.families import FAMILIES
from rl_moe.envs.suites import load_suite, suite_from_dict
from rl_moe.envs.wrappers import InfoSuccess
from rl_moe.errors import UsageError

SUITES = Path(__file__).resolve().parents[1] / "envs" / "suites"


def _object_positions(suite_name: str, seeds: tuple[int, ...], resets: int) -> list[list[np.ndarray]]:
    suite = load_suite(suite_name)
    out = []
    for seed in seeds:
        env = task_factories(suite, suite.tasks[0], 1, seed)[0]()
        out.append([env.reset()[0][4:7].copy() for _ in range(resets)])  # the hammer's position
        env.close()
    return out


def test_fixed_positions_keep_each_envs_first_position_and_resample_draws_anew() -> None:
    (a, b) = _object_positions("cw10", (3, 4), 3)
    assert all(np.array_equal(a[0], p) for p in a)  # fixed across resets
    assert not np.array_equal(a[0], b[0])  # a position per seed
    assert np.array_equal(_object_positions("cw10", (3,), 1)[0][0], a[0])  # and the same again
    (r,) = _object_positions("cw10-cw", (3,), 3)
    assert not np.array_equal(r[0], r[1]) and not np.array_equal(r[1], r[2])


def test_paper_suite_states_its_protocol() -> None:
    paper, cw = load_suite("cw10"), load_suite("cw10-cw")
    assert paper.task_names == cw.task_names
    assert paper.episode_length == 500 and cw.episode_length == 200
    assert all(t.params["position_rule"] == "fixed" for t in (*paper.tasks, *paper.probe_tasks))
    assert all("position_rule" not in t.params for t in cw.tasks)
    cfg = resolve(RunRequest(suite="cw10", method="topk", tasks=1))
    assert cfg.ppo.grad_clip == "separate" and cfg.eval.positions == "both"
    assert resolve(RunRequest(suite="cw10-cw", method="topk", tasks=1)).ppo.grad_clip == "joint"


def test_task_defaults_sit_beneath_a_tasks_own_fields() -> None:
    data = json.loads((SUITES / "cw10-cw.json").read_text())
    data["task_defaults"] = {"position_rule": "fixed"}
    data["tasks"][1] = {"name": data["tasks"][1]["name"], "position_rule": "resample"}
    suite = suite_from_dict(data)
    assert suite.tasks[0].params["position_rule"] == "fixed" and suite.tasks[1].params["position_rule"] == "resample"
    assert suite_from_dict(suite.to_dict()).tasks == suite.tasks  # config.json round trip
    # files and stored configs written before the rename said "positions": read as today's name
    data["task_defaults"] = {"positions": "fixed"}
    data["tasks"][1] = {"name": data["tasks"][1]["name"], "positions": "resample"}
    assert suite_from_dict(data).tasks == suite.tasks
    data["task_defaults"] = {"position_rule": "frozen"}
    with pytest.raises(UsageError, match="position_rule 'frozen'.*resample, fixed"):
        FAMILIES["metaworld"].check_tasks(suite_from_dict(data))
    data["task_defaults"] = {"name": "x"}
    with pytest.raises(UsageError, match="task_defaults may not set name"):
        suite_from_dict(data)
    data.pop("task_defaults")
    data["eval"] = {"postions": "train"}
    with pytest.raises(UsageError, match="unknown eval setting 'postions'.*positions"):
        check_suite_settings(suite_from_dict(data))


def test_envpool_names_why_it_cannot_keep_fixed_positions() -> None:
    suite = load_suite("cw10")
    task = next(t for t in suite.tasks if t.name == "push-wall-v3")
    reason = FAMILIES["metaworld"].pool(task, [0, 1], 500, 1)
    assert isinstance(reason, str) and "positions fixed" in reason and "new ones at every reset" in reason


class _Flags:
    """A stand-in env whose ``info["success"]`` follows a script."""

    def __init__(self, flags: list[bool]) -> None:
        self.flags = flags
        self.t = 0

    def step(self, action):
        self.t += 1
        return None, 0.0, False, self.t == len(self.flags), {"success": self.flags[self.t - 1]}


def test_success_at_any_step_and_at_the_last_step() -> None:
    wrapper = InfoSuccess.__new__(InfoSuccess)  # the wrapper's logic alone, without a gym env
    wrapper.env, wrapper._success = _Flags([False, True, False]), False
    infos = [wrapper.step(None)[4] for _ in range(3)]
    assert [i["is_success"] for i in infos] == [False, True, True]
    assert [i["success_last"] for i in infos] == [False, True, False]


def test_eval_point_values_and_padding() -> None:
    point = EvalPoint(EvalResult(1.0, 5.0, 2, 0.5), EvalResult(0.0, 1.0, 2, 0.0))
    assert point.success == 1.0
    values = point.curve_values()
    assert values == {"success": 1.0, "return": 5.0, "success_last": 0.5, "success_heldout": 0.0, "return_heldout": 1.0, "success_last_heldout": 0.0}
    curve = {"steps": [0, 10], "success": [0.0, 0.5], "return": [1.0, 2.0]}  # written before the new keys
    append_point(curve, 20, values)
    assert all(len(v) == 3 for v in curve.values())
    assert curve["success_heldout"] == [None, None, 0.0] and curve["steps"] == [0, 10, 20]


@pytest.mark.parametrize("positions", ["heldout", "train", "both"])
def test_eval_views_use_training_or_own_seeds(positions: str) -> None:
    cfg = resolve(RunRequest(suite="cw10", method="topk", tasks=2, overrides=(f"eval.positions={positions}",)))
    sched = ContinualScheduler(cfg, Path("/nonexistent-run"), progress=False)
    train = [f.seed for f in task_factories(sched.suite, sched.tasks[1], cfg.eval.n_envs, env_seed(cfg.seed, "train", 1))]
    main_view = [f.seed for f in sched.eval_factories(1)]
    heldout = [f.seed for f in sched.eval_factories(1, heldout=True)]
    assert (main_view == train) == (positions != "heldout")
    assert set(heldout).isdisjoint(train)


def test_both_views_reach_results_and_tensorboard(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    rc = main(["--suite", "smoke", "--tasks", "1", "--steps-per-task", "256", "--out", str(out), "--preset", "tiny", "--no-progress", "--set", "eval.positions=both"])
    assert rc == 0
    (run,) = [p for p in out.glob("*/*") if p.is_dir()]
    curve = json.loads((run / "results.json").read_text())["eval_curves"]["pendulum-0"]
    assert {"success_heldout", "return_heldout", "success_last", "success_last_heldout"} <= set(curve)
    assert all(len(v) == len(curve["steps"]) for v in curve.values())
    assert all(v is not None for v in curve["return_heldout"])
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    assert {"eval/success_heldout", "eval/success_last", "train/grad_norm_actor"} <= set(acc.Tags()["scalars"])


def test_bad_eval_positions_exits_2(tmp_path: Path, capsys) -> None:
    rc = main(["--suite", "smoke", "--tasks", "1", "--out", str(tmp_path / "r"), "--no-progress", "--set", "eval.positions=mine"])
    assert rc == 2
    assert "eval.positions 'mine'" in capsys.readouterr().err and not (tmp_path / "r").exists()
    rc = main(["--suite", "smoke", "--tasks", "1", "--out", str(tmp_path / "r"), "--no-progress", "--set", "ppo.grad_clip=both"])
    assert rc == 2 and "ppo.grad_clip 'both'" in capsys.readouterr().err


def test_episode_stages_average_the_last_info_of_finished_episodes() -> None:
    from stable_baselines3.common.logger import Logger

    from rl_moe.envs.stages import EpisodeStages

    cb = EpisodeStages(("grasp_success", "in_place_reward"))
    logger = Logger(folder=None, output_formats=[])
    cb.model = type("M", (), {"logger": logger})()  # what BaseCallback.logger reads
    steps = [
        (np.array([False, True]), [{"grasp_success": 1.0}, {"grasp_success": 0.0, "in_place_reward": 0.5}]),
        (np.array([True, True]), [{"grasp_success": 1.0, "in_place_reward": 0.1}, {"grasp_success": 1.0, "in_place_reward": 0.3}]),
    ]
    for dones, infos in steps:
        cb.locals = {"dones": dones, "infos": infos}
        cb._on_step()
    cb._on_rollout_end()
    assert logger.name_to_value["rollout/final_grasp_success"] == pytest.approx(2 / 3)
    assert logger.name_to_value["rollout/final_in_place_reward"] == pytest.approx(0.3)
    assert FAMILIES["metaworld"].stage_keys and "grasp_success" in FAMILIES["metaworld"].stage_keys


def test_paper_suite_run_records_its_rules_stages_and_both_views(tmp_path: Path) -> None:
    """A real MetaWorld run under cw10-paper: 500-step episodes end inside 1,024 steps on 2 envs."""
    out = tmp_path / "runs"
    rc = main(["--suite", "cw10", "--method", "topk", "--tasks", "1", "--steps-per-task", "1024", "--out", str(out), "--preset", "tiny", "--no-progress"])
    assert rc == 0
    (run,) = [p for p in out.glob("*/*") if p.is_dir()]
    res = json.loads((run / "results.json").read_text())
    assert res["rules"] == {"episode_length": 500, "task_fields": {"position_rule": "fixed"}, "grad_clip": "separate", "eval_positions": "both"}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"rollout/final_grasp_success", "rollout/final_in_place_reward", "eval/success_heldout", "train/grad_norm_critic"} <= tags
    ep_len = acc.Scalars("rollout/ep_len_mean")[-1].value
    assert ep_len == 500


@pytest.mark.parametrize(
    ("suite", "sets", "tag"),
    [
        ("cw10", (), ""),
        ("cw10", ("ppo.grad_clip=joint",), "-clip-joint"),
        ("cw10", ("ppo.grad_clip=separate", "eval.positions=heldout"), "-eval-heldout"),
        ("cw10-cw", ("ppo.grad_clip=separate",), "-clip-separate"),
        ("cw10-cw", ("ppo.grad_clip=joint", "eval.positions=heldout"), ""),  # the suite's own rules, named again
        ("cw10-cw", ("ppo.grad_clip=separate", "eval.positions=train"), "-clip-separate-eval-train"),
    ],
)
def test_a_run_that_changes_its_suites_rules_names_them(suite: str, sets: tuple[str, ...], tag: str, tmp_path: Path) -> None:
    from rl_moe.continual.resolve import rules_tag
    from rl_moe.crl import _new_run_dir
    from rl_moe.sweep import SweepConfig, grid

    cfg = resolve(RunRequest(suite=suite, method="topk", protocol="rl", vec_env="dummy", overrides=sets))
    assert rules_tag(cfg) == tag
    assert _new_run_dir(cfg, str(tmp_path)).name.startswith(f"ppo-topk-rl{tag}-s0-")
    args = tuple(a for s in sets for a in ("--set", s))
    (trial,) = grid(SweepConfig(suites=(suite,), methods=("topk",), protocols=("rl",), out=tmp_path, crl_args=args))
    assert trial.run_dir == tmp_path / suite / f"ppo-topk-rl{tag}-s0"
    # the --set=KEY=VALUE spelling names the same folder
    (same,) = grid(SweepConfig(suites=(suite,), methods=("topk",), protocols=("rl",), out=tmp_path, crl_args=tuple(f"--set={s}" for s in sets)))
    assert same.run_dir == trial.run_dir


def test_the_sweeps_rules_tag_reads_flags_in_command_line_order(tmp_path: Path) -> None:
    from rl_moe.sweep import SweepConfig, grid

    # The later --set wins, as in the CLI, whichever spelling each uses.
    args = ("--set=ppo.grad_clip=joint", "--set", "ppo.grad_clip=separate")
    (trial,) = grid(SweepConfig(suites=("cw10",), methods=("topk",), protocols=("rl",), out=tmp_path, crl_args=args))
    assert trial.run_dir.name == "ppo-topk-rl-s0"
    (trial,) = grid(SweepConfig(suites=("cw10",), methods=("topk",), protocols=("rl",), out=tmp_path, crl_args=("--set", "ppo.grad_clip=separate", "--set=ppo.grad_clip=joint")))
    assert trial.run_dir.name == "ppo-topk-rl-clip-joint-s0"


def test_td3_runs_have_no_clipping_rule_to_name() -> None:
    from rl_moe.continual.resolve import rules_tag

    cfg = resolve(RunRequest(suite="cw10", algo="td3", method="topk", vec_env="dummy", overrides=("eval.positions=train",)))
    assert cfg.rules()["grad_clip"] is None
    assert rules_tag(cfg) == "-eval-train"
