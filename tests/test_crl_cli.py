"""End-to-end runs of ``python -m rl_moe.crl`` (tiny budgets): artifacts, CRL vs RL, resume, errors."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.save_util import load_from_zip_file

from rl_moe.continual import scheduler as sched_mod
from rl_moe.continual.resolve import RunRequest, resolve
from rl_moe.continual.results import Results
from rl_moe.continual.state_files import load_regularizer_state
from rl_moe.continual.scheduler import ContinualScheduler
from rl_moe.crl import main
from rl_moe.rundir import RunDir
from tests.conftest import CLI_TINY, import_error_from
from tools import collect_runs

TINY = CLI_TINY


def _run_dir(out: Path) -> Path:
    dirs = [p for p in out.glob("*/*") if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def _check_artifacts(run: Path, tasks: list[str], algo: str, method: str) -> dict:
    assert run.name.startswith(f"{algo}-{method}-crl-s0-")
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["algo"] == algo and cfg["method"] == method and cfg["net"]["hidden"] == [32, 32]
    assert list((run / "tb").glob("events.out.tfevents.*"))
    assert [p.name for p in sorted((run / "checkpoints").glob("*.zip"))] == [f"task_{i:02d}_{t}.zip" for i, t in enumerate(tasks)]
    assert torch.load(run / "probe_states.pt").shape[0] == 32
    res = json.loads((run / "results.json").read_text())
    assert res["schema"] == 1 and res["complete"] and res["finished_tasks"] == len(tasks) and res["tasks"] == tasks
    n = len(tasks)
    assert len(res["success_matrix"]) == n and all(len(r) == n for r in res["success_matrix"])
    assert all(v is not None and 0.0 <= v <= 1.0 for r in res["success_matrix"] for v in r)
    assert res["own_success"] == [res["success_matrix"][i][i] for i in range(n)]
    assert res["final_success"] == res["success_matrix"][-1]
    for i, t in enumerate(tasks):
        start, end = res["task_segments"][i]
        steps = res["eval_curves"][t]["steps"]
        assert steps[0] == start and steps[-1] == end >= start + res["steps_per_task"]
    assert set(res["cl_metrics"]) == {"average_performance", "forgetting", "forward_transfer"}
    return res


@pytest.mark.parametrize("algo", ["ppo", "td3"])
def test_smoke_end_to_end(tmp_path: Path, algo: str) -> None:
    out = tmp_path / "runs"
    rc = main(["--suite", "smoke", "--algo", algo, "--method", "sphere", "--tasks", "2", "--steps-per-task", "256", "--out", str(out), *TINY])
    assert rc == 0
    res = _check_artifacts(_run_dir(out), ["pendulum-0", "pendulum-1"], algo, "sphere")
    assert res["cl_metrics"]["forward_transfer"] is None  # no reference given
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(_run_dir(out) / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"eval/success", "eval/return", "cl/success_after_task", "time/task_seconds"} <= tags
    assert [e.step for e in acc.Scalars("cl/success_after_task")] == [0, 1]
    assert max(e.step for e in acc.Scalars("eval/success")) >= 256  # global steps continue across tasks
    table = acc.Tensors("hyperparameters/text_summary")[0].tensor_proto.string_val[0].decode()
    assert f"|algo|{algo}|" in table and "|method|sphere|" in table and "|seed|0|" in table


def test_cw10_two_real_metaworld_tasks(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    rc = main(["--suite", "cw10-cw", "--method", "topk", "--tasks", "2", "--steps-per-task", "128", "--out", str(out),
               *TINY, "--set", "eval.n_episodes=1", "--set", "eval.matrix_episodes=1", "--set", "eval.n_envs=1"])  # fmt: skip
    assert rc == 0
    _check_artifacts(_run_dir(out), ["hammer-v3", "push-wall-v3"], "ppo", "topk")


class _Snapshot(BaseCallback):
    """Actor parameters and Adam step count at the start of every task."""

    def __init__(self) -> None:
        super().__init__()
        self.params: list[dict[str, torch.Tensor]] = []
        self.adam_steps: list[int] = []

    def _on_training_start(self) -> None:
        self.params.append({k: v.detach().clone() for k, v in self.model.policy.state_dict().items()})
        state = self.model.policy.optimizer.state_dict()["state"]
        self.adam_steps.append(int(max((s["step"] for s in state.values()), default=0)))

    def _on_step(self) -> bool:
        return True


def _snapshot_run(tmp_path: Path, protocol: str) -> tuple[_Snapshot, Path]:
    cfg = resolve(RunRequest(suite="smoke", method="topk", protocol=protocol, tasks=2, steps_per_task=128, preset="tiny"))
    run = tmp_path / protocol
    run.mkdir()
    snap = _Snapshot()
    ContinualScheduler(cfg, run, progress=False, callbacks=[snap]).run()
    return snap, run


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_crl_carries_parameters_and_optimizer_rl_reinitializes(tmp_path: Path) -> None:
    from stable_baselines3 import PPO

    crl, crl_dir = _snapshot_run(tmp_path, "crl")
    after_task0 = PPO.load(RunDir(crl_dir).checkpoint(0, "pendulum-0"), device="cpu").policy.state_dict()
    assert not _same(crl.params[0], after_task0)  # task 0 trained
    assert _same(crl.params[1], after_task0)  # task 1 starts from task 0's final parameters
    assert crl.adam_steps[0] == 0 and crl.adam_steps[1] > 0  # Adam moments kept

    rl, rl_dir = _snapshot_run(tmp_path, "rl")
    rl_after_task0 = PPO.load(RunDir(rl_dir).checkpoint(0, "pendulum-0"), device="cpu").policy.state_dict()
    assert _same(rl.params[1], rl.params[0])  # fresh (same-seed) initialization
    assert not _same(rl.params[1], rl_after_task0)
    assert rl.adam_steps == [0, 0]


def test_interrupt_then_resume_trains_each_task_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "runs"
    argv = ["--suite", "smoke", "--method", "topk", "--tasks", "3", "--steps-per-task", "128", "--out", str(out), *TINY]
    trained: list[int] = []
    original = ContinualScheduler._train_task

    def interrupting(self: ContinualScheduler, task: sched_mod.TaskRun, probe: object) -> None:
        trained.append(task.index)
        if task.index == 1 and len(trained) == 2:
            raise KeyboardInterrupt  # Ctrl-C during task 2
        original(self, task, probe)

    monkeypatch.setattr(sched_mod.ContinualScheduler, "_train_task", interrupting)
    assert main(argv) == 130
    err = capsys.readouterr().err
    run = _run_dir(out)
    assert f"python -m rl_moe.crl --resume {run}" in err and "Traceback" not in err
    partial = json.loads((run / "results.json").read_text())
    assert partial["finished_tasks"] == 1 and not partial["complete"] and partial["final_success"] == [None] * 3
    first_ckpt = RunDir(run).checkpoint(0, "pendulum-0").read_bytes()

    capsys.readouterr()
    assert main(["--resume", str(run), "--no-progress"]) == 0
    assert "resuming at task 2/3 (1 finished)" in capsys.readouterr().out
    assert trained == [0, 1, 1, 2]  # task 0 not retrained, none skipped
    assert RunDir(run).checkpoint(0, "pendulum-0").read_bytes() == first_ckpt
    res = json.loads((run / "results.json").read_text())
    assert res["complete"] and res["finished_tasks"] == 3 and all(v is not None for v in res["final_success"])
    assert [s[0] for s in res["task_segments"]] == [0, res["task_segments"][0][1], res["task_segments"][1][1]]
    assert main(["--resume", str(run)]) == 0  # already complete: nothing to do
    assert main(["--resume", str(run), "--set", "ppo.lr_start=1e-4"]) == 0
    assert "already complete; nothing to do (ignored: --set ppo.lr_start=1e-4)" in capsys.readouterr().out


def test_resume_continues_the_regularizers_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # CBP's utilities and ages and ReDo's step counter live outside the SB3 checkpoint.
    run = tmp_path / "run"
    argv = ["--suite", "smoke", "--method", "cbp", "--tasks", "2", "--steps-per-task", "128", "--run-dir", str(run), *TINY]
    original = ContinualScheduler._train_task

    def stop_at_task_2(self: ContinualScheduler, task: sched_mod.TaskRun, probe: object) -> None:
        if task.index == 1:
            raise KeyboardInterrupt
        original(self, task, probe)

    monkeypatch.setattr(sched_mod.ContinualScheduler, "_train_task", stop_at_task_2)
    assert main(argv) == 130
    saved = load_regularizer_state(RunDir.regularizer_state(RunDir(run).checkpoint(0, "pendulum-0")))
    assert saved is not None and saved["0:cbp"]["layers"], saved
    ages = [layer["age"] for layer in saved["0:cbp"]["layers"].values()]
    assert all(int(a.max()) > 0 for a in ages)

    loaded: list[dict] = []
    monkeypatch.setattr(sched_mod.ContinualScheduler, "_train_task", original)
    monkeypatch.setattr(sched_mod.ContinualScheduler, "_prepare_model", _spy_prepare(loaded))
    assert main(["--resume", str(run), "--no-progress"]) == 0
    state = loaded[0]["0:cbp"]  # right after the resumed model was built and loaded
    assert state["n_replaced"] == saved["0:cbp"]["n_replaced"]
    for key, layer in saved["0:cbp"]["layers"].items():
        assert torch.equal(state["layers"][key]["age"], layer["age"]) and torch.equal(state["layers"][key]["util"], layer["util"])


def _spy_prepare(log: list[dict]):
    original = ContinualScheduler._prepare_model

    def prepare(self: ContinualScheduler, i: int, env: object) -> None:
        original(self, i, env)  # type: ignore[arg-type]
        log.append(self.model.regularizer_state())  # type: ignore[union-attr]

    return prepare


def test_forward_transfer_with_rl_reference(tmp_path: Path) -> None:
    base = ["--suite", "smoke", "--method", "topk", "--tasks", "2", "--steps-per-task", "128", *TINY]
    assert main([*base, "--protocol", "rl", "--run-dir", str(tmp_path / "rl")]) == 0
    assert main([*base, "--run-dir", str(tmp_path / "crl"), "--reference", str(tmp_path / "rl")]) == 0
    crl = json.loads((tmp_path / "crl" / "results.json").read_text())
    rl = json.loads((tmp_path / "rl" / "results.json").read_text())
    # Success on this budget is 0, so both AUCs are 0 and the transfer is exactly 0.
    assert rl["cl_metrics"]["forward_transfer"] is None
    assert crl["cl_metrics"]["forward_transfer"] == pytest.approx(0.0)

    # Known answer away from 0/0: constant success 0.75 (CRL) against 0.5 (reference) on every
    # task gives AUCs 0.75 and 0.5, so FT = (0.75 - 0.5) / (1 - 0.5) = 0.5.
    from rl_moe.continual.results import Results, reference_aucs

    def flat(res: dict, value: float) -> None:
        for curve in res["eval_curves"].values():
            curve["success"] = [value] * len(curve["success"])

    flat(rl, 0.5)
    (tmp_path / "rl" / "results.json").write_text(json.dumps(rl))
    flat(crl, 0.75)
    res = Results.from_dict(crl)
    res.reference_aucs = reference_aucs(tmp_path / "rl", res.tasks)
    assert res.reference_aucs == pytest.approx([0.5, 0.5])
    assert res.cl_metrics()["forward_transfer"] == pytest.approx(0.5)


BAD_INPUTS = [
    (["--suite", "cw11"], "valid choices: cw10, cw10-cw, cw20, cw20-cw, hb5, smoke, cw10-paper"),
    (["--algo", "sac"], "valid choices: ppo, td3"),
    (["--method", "moe"], "valid choices: topk, dense_moe"),
    (["--protocol", "joint"], "valid choices: crl, rl"),
    (["--steps-per-task", "0"], "--steps-per-task must be in 1..100,000,000, got 0"),
    (["--steps-per-task", "-5"], "--steps-per-task must be in 1..100,000,000, got -5"),
    (["--tasks", "11"], "must be in 1..10"),
    (["--tasks", "0"], "must be in 1..10"),
    (["--experts", "4", "--top-k", "5"], "top_k must be in [1, n_experts=4]"),
    (["--device", "tpu"], "valid choices: auto, cpu, cuda"),
    (["--vec-env", "ray"], "valid choices: auto, dummy, subproc"),
    (["--set", "ppo.n_stepz=3"], "valid fields of ppo"),
    (["--set", "ppo.n_steps=-1"], "must be > 0"),
    (["--set", "ppo.fast_update=fast"], "unknown ppo.fast_update 'fast'; valid choices: auto, on, off"),
    (["--preset", "huge"], "valid choices: tiny"),
    (["--reference", "/nonexistent/run"], "not a run folder"),
    (["--resume", "/nonexistent/run"], "no such run folder"),
    (["--seed", "x"], "invalid int value"),
    (["--threads", "0"], "--threads must be a positive integer or auto, got '0'"),
    (["--set", "reg.sphere.rho=abc"], "expected a finite float"),
    (["--set", "reg.sphere.rho=NaN"], "expected a finite float"),
    (["--set", "reg.nosuchreg.x=1"], "unknown regularizer 'nosuchreg'"),
    (["--set", "reg.cbp.replacement_rate=0.5"], "this method does not use 'cbp'"),
    (["--set", "reg.sphere.rhoo=0.5"], "valid fields of reg.sphere"),
    (["--set", "ppo.n_steps=1e400"], "expected an int"),
    (["--set", "ppo.lr_start=inf"], "expected a finite float"),
    (["--set", "ppo.gamma=5"], "must be in (0, 1]"),
    (["--set", "ppo.batch_size=1"], "ppo.batch_size must be >= 2"),
    (["--set", "ppo.n_steps=1", "--set", "ppo.n_envs=1"], "ppo.n_envs * ppo.n_steps must be >= 2"),
    (["--seed", "4294967296"], "--seed must be in 0..42948"),
    (["--set", "net.init=xavier"], "unknown init 'xavier'; valid choices: orthogonal, lecun"),
    (["--method", "soft", "--set", "net.init=lecun"], "valid kinds for it: topk, ds, dense_moe, expert_choice, mlp"),
    (["--steps-per-task", "1000000000000"], "--steps-per-task must be in 1..100,000,000"),
]


@pytest.mark.parametrize("argv,message", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_exits_2_with_choices_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture, argv: list[str], message: str) -> None:
    out = tmp_path / "runs"
    try:
        rc = main(["--suite", "cw10-cw", *argv, "--out", str(out)] if "--suite" not in argv else [*argv, "--out", str(out)])
    except SystemExit as exc:  # argparse type errors
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize(("config", "message"), [(None, "no config.json there"), ("{not json", "bad config.json")])
def test_resume_of_a_folder_without_a_readable_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture, config, message: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    if config is not None:
        (run / "config.json").write_text(config)
    before = sorted(p.name for p in run.iterdir())
    assert main(["--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert sorted(p.name for p in run.iterdir()) == before


def test_list_names_every_suite_and_method(capsys: pytest.CaptureFixture) -> None:
    from rl_moe.continual.methods import METHODS

    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    suites = {line.split(":")[0].split(" (")[0].strip(): line for line in out.split("methods:")[0].splitlines()[1:]}
    assert out.startswith("suites:\n") and list(suites) == ["cw10", "cw10-cw", "cw20", "cw20-cw", "hb5", "smoke"]
    # each with its rules and its description: the paper's protocol and Continual World's told apart
    assert "(also: cw10-paper): 10 tasks, authors network, 500-step episodes, position_rule fixed, separate gradient clipping, evaluated on both positions." in suites["cw10"]
    assert "20 tasks, sb3 network, 200-step episodes, joint gradient clipping, evaluated on heldout positions. Continual World CW20" in suites["cw20-cw"]
    assert all(f"  {name} " in out for name in METHODS)


def test_bad_regularizer_kwarg_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--suite", "smoke", "--method", "sphere", "--set", "reg.sphere.not_a_kwarg=1", "--out", str(tmp_path / "r")]) == 2
    assert "not_a_kwarg" in capsys.readouterr().err and not (tmp_path / "r").exists()


def test_unknown_task_in_user_suite_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = json.loads((Path(__file__).resolve().parents[1] / "envs" / "suites" / "cw10-cw.json").read_text())
    data["tasks"][1] = {"name": "push-wal-v3"}
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(data))
    assert main(["--suite", str(path), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "'push-wal-v3'" in err and "push-wall-v3" in err and not (tmp_path / "r").exists()


@pytest.mark.skipif(__import__("importlib").util.find_spec("humanoid_bench") is not None, reason="HumanoidBench installed")
def test_hb5_without_humanoidbench_names_install_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--suite", "hb5", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert "HumanoidBench is not installed" in err and "pip install" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_a_ctrl_c_inside_an_import_exits_130_and_other_import_errors_do_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from rl_moe.cli import interrupts_as_keyboard

    # A signal in a C extension's import surfaces as its ImportError, raised from the interrupt
    # (CI saw MuJoCo's "initialization failed" exit 1 with a traceback).
    def failed_import(during: bool) -> None:
        raise import_error_from(KeyboardInterrupt() if during else OSError("not an interrupt"))

    with pytest.raises(KeyboardInterrupt), interrupts_as_keyboard():
        failed_import(True)
    with pytest.raises(ImportError), interrupts_as_keyboard():
        failed_import(False)
    with pytest.raises(OSError, match="disk full"), interrupts_as_keyboard():  # a clean-up's own failure
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise OSError("disk full")  # noqa: B904

    out = tmp_path / "runs"
    argv = ["--suite", "smoke", "--method", "topk", "--tasks", "2", "--steps-per-task", "128", "--out", str(out), *TINY]
    original = sched_mod.vec_env_backend

    def backend(env: object, family: str) -> str:  # task 2's record, outside learn()
        if len(list(out.glob("*/*/checkpoints/task_*"))):
            failed_import(True)
        return original(env, family)

    monkeypatch.setattr(sched_mod, "vec_env_backend", backend)
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert "Resume with: python -m rl_moe.crl --resume" in err and "Traceback" not in err
    assert json.loads(next(out.glob("*/*/results.json")).read_text())["finished_tasks"] == 1


def test_handlers_of_damaged_files_and_optional_imports_pass_a_ctrl_c_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins
    import pickle

    from rl_moe.continual import intask
    from rl_moe.sweep import backends

    def interrupted(*_: object, **__: object) -> None:
        raise import_error_from(KeyboardInterrupt())

    def missing() -> None:
        raise ImportError("no module named 'ray'")

    def importing_ray_calls(fail: Callable[[], None]) -> Callable[..., object]:
        def imp(name: str, *args: object, **kwargs: object) -> object:
            if name == "ray":
                fail()
            return real_import(name, *args, **kwargs)

        return imp

    # An in-task checkpoint whose load was interrupted is not "unreadable" (the run would restart
    # the task and overwrite it), and an interrupted `import ray` is not "ray missing".
    path = tmp_path / "in_task.pkl"
    path.write_bytes(pickle.dumps({"version": intask.VERSION}))
    monkeypatch.setattr(pickle, "load", interrupted)
    with pytest.raises(KeyboardInterrupt):
        intask.read(path)
    monkeypatch.undo()
    real_import = builtins.__import__
    monkeypatch.setattr(builtins, "__import__", importing_ray_calls(interrupted))
    with pytest.raises(KeyboardInterrupt):
        backends.ray_available()
    monkeypatch.setattr(builtins, "__import__", importing_ray_calls(missing))
    assert backends.ray_available() is False  # a missing package is still a fallback


def test_real_sigint_exits_130_without_traceback(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "runs"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rl_moe.crl", "--suite", "smoke", "--preset", "tiny", "--steps-per-task", "100000", "--out", str(out), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.time() + 60
    while not list(out.glob("*/*/probe_states.pt")) and time.time() < deadline:  # training has begun
        time.sleep(0.2)
    time.sleep(1.0)
    # A second Ctrl-C during the clean-up must not change the exit code (it made Python re-raise
    # SIGINT now and then: exit status -2 instead of 130).
    for _ in range(40):  # an impatient user: Ctrl-C held down through the clean-up and exit
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGINT)
        time.sleep(0.01)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Resume with: python -m rl_moe.crl --resume" in err and "Traceback" not in err
    res = json.loads(next(out.glob("*/*/results.json")).read_text())
    assert res["finished_tasks"] == 0 and not res["complete"]


def test_vecnormalize_statistics_carry_over_in_crl(tmp_path: Path) -> None:
    import pickle

    argv = ["--suite", "smoke", "--method", "topk", "--tasks", "2", "--steps-per-task", "128", *TINY,
            "--set", "ppo.normalize_obs=true", "--set", "ppo.normalize_reward=true"]  # fmt: skip
    counts = {}
    for protocol in ("crl", "rl"):
        run = tmp_path / protocol
        assert main([*argv, "--protocol", protocol, "--run-dir", str(run)]) == 0
        stats = [pickle.loads(RunDir.vecnormalize(RunDir(run).checkpoint(i, f"pendulum-{i}")).read_bytes()) for i in (0, 1)]
        counts[protocol] = [s.obs_rms.count for s in stats]
    # Each task adds 128 observations (+ resets); CRL accumulates, RL restarts.
    assert counts["crl"][1] > counts["crl"][0] + 100
    assert counts["rl"][1] == pytest.approx(counts["rl"][0], rel=0.05)

    # Resume a CRL run after task 0: the statistics come back from checkpoint 0's .pkl.
    run = tmp_path / "crl"
    res = json.loads((run / "results.json").read_text())
    res.update(finished_tasks=1, global_step=res["task_segments"][0][1], task_segments=res["task_segments"][:1], complete=False)
    res["success_matrix"][1] = [None, None]
    (run / "results.json").write_text(json.dumps(res))
    assert main(["--resume", str(run), "--no-progress"]) == 0
    resumed = pickle.loads(RunDir.vecnormalize(RunDir(run).checkpoint(1, "pendulum-1")).read_bytes())
    assert resumed.obs_rms.count == pytest.approx(counts["crl"][1])


def test_sigint_during_startup_exits_130_without_traceback(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "rl_moe.crl", "--suite", "smoke", "--preset", "tiny", "--out", str(tmp_path / "runs"), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    # Wait until torch's libraries are being mapped: the CLI's start-up handler is installed before
    # its first heavy import, and torch + stable-baselines3 take seconds more to load. A fixed
    # sleep could fire before the interpreter itself is up on a loaded machine.
    maps, deadline = Path(f"/proc/{proc.pid}/maps"), time.time() + 60
    while maps.exists() and "libtorch" not in maps.read_text() and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip() == "interrupted" and not (tmp_path / "runs").exists()  # stopped during the imports


@pytest.mark.parametrize(
    "damage", ["checkpoint_garbage", "checkpoint_truncated", "checkpoint_missing", "results_json", "regularizer_state",
               "results_matrix_shape", "probe_states", "training_state"]
)  # fmt: skip
def test_resume_with_corrupt_files_exits_2_and_changes_nothing(tmp_path: Path, capsys, damage: str) -> None:
    run = tmp_path / "run"
    assert main(["--suite", "smoke", "--method", "topk", "--tasks", "2", "--steps-per-task", "128", "--run-dir", str(run), *TINY]) == 0
    results = json.loads((run / "results.json").read_text())
    # As if interrupted during task 2.
    results.update(finished_tasks=1, complete=False, task_segments=results["task_segments"][:1], global_step=results["task_segments"][0][1])
    (run / "results.json").write_text(json.dumps(results))
    ckpt = RunDir(run).checkpoint(0, "pendulum-0")
    if damage == "checkpoint_garbage":
        ckpt.write_bytes(b"not a zip")
    elif damage == "checkpoint_truncated":
        ckpt.write_bytes(ckpt.read_bytes()[:-200])
    elif damage == "checkpoint_missing":
        ckpt.unlink()
    elif damage == "regularizer_state":
        RunDir.regularizer_state(ckpt).write_bytes(b"garbage")
    elif damage == "results_matrix_shape":
        (run / "results.json").write_text(json.dumps({**results, "success_matrix": [[0.0]]}))
    elif damage == "training_state":
        RunDir.training_state(ckpt).write_bytes(b"garbage")
    elif damage == "probe_states":
        (run / "probe_states.pt").write_bytes(b"garbage")
    else:
        (run / "results.json").write_text("{truncated")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(["--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot resume")
    assert ("results.json" in err[0]) == damage.startswith("results_")
    assert ("probe_states.pt" in err[0]) == (damage == "probe_states")
    assert ("training state" in err[0]) == (damage == "training_state")
    assert ("regularizer state" in err[0]) == (damage == "regularizer_state")
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("--run-dir {file}", "is a file, not a folder"),
        ("--out {file}/sub", "which is a file, not a folder"),
        ("--run-dir /dev/null/x", "which is a file, not a folder"),
        ("--out {ro}", "no permission to write in"),
    ],
)
def test_unusable_paths_exit_2_before_training(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, where: str, message: str) -> None:
    import os

    afile = tmp_path / "afile"
    afile.write_text("keep me")
    ro = tmp_path / "ro"
    ro.mkdir()
    real_access = os.access
    # Root may write anywhere, so a read-only folder is simulated where os.access asks.
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == ro else real_access(p, mode))
    flag, value = where.format(file=afile, ro=ro).split(" ", 1)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    assert main(["--suite", "smoke", "--tasks", "1", *TINY, flag, value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "Traceback" not in err[0], err
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before and afile.read_text() == "keep me"


def test_larger_tasks_extends_a_finished_run_like_one_run(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # A 2-task CRL run resumed with --tasks 3 trains only the third task, and ends where a 3-task
    # run ends: the same weights, the same own-task successes.
    common = ["--suite", "smoke", "--method", "topk", "--steps-per-task", "128", *TINY]
    whole, grown = tmp_path / "whole", tmp_path / "grown"
    assert main([*common, "--tasks", "3", "--run-dir", str(whole)]) == 0
    assert main([*common, "--tasks", "2", "--run-dir", str(grown)]) == 0
    first = RunDir(grown).checkpoint(0, "pendulum-0").read_bytes()
    two = tmp_path / "two"
    shutil.copytree(grown, two, ignore=shutil.ignore_patterns("checkpoints"))
    capsys.readouterr()
    assert main([*common, "--tasks", "2", "--run-dir", str(grown)]) == 0
    assert "already complete" in capsys.readouterr().out
    assert main([*common, "--tasks", "3", "--run-dir", str(grown)]) == 0
    assert "resuming at task 3/3 (2 finished)" in capsys.readouterr().out
    assert RunDir(grown).checkpoint(0, "pendulum-0").read_bytes() == first
    a, b = (json.loads((run / "results.json").read_text()) for run in (whole, grown))
    assert b["complete"] and b["tasks"] == a["tasks"] == ["pendulum-0", "pendulum-1", "pendulum-2"]
    assert json.loads((grown / "config.json").read_text())["tasks"] == a["tasks"]
    assert b["own_success"] == a["own_success"] and b["final_success"] == a["final_success"]
    assert b["success_matrix"][1] == [*a["success_matrix"][1][:2], None]  # evaluated when it was the last row
    assert b["task_segments"] == a["task_segments"]
    pa, pb = (load_from_zip_file(RunDir(run).checkpoint(2, "pendulum-2"))[1]["policy"] for run in (whole, grown))
    assert _same(pa, pb)
    # ... and its first 2 tasks, cut out again, are the 2-task run as it stood before it went on
    # (tools/collect_runs.py --tasks: a slice run continued over CW10 is still a slice run)
    assert Results.from_dict(b).head(2).to_dict() == json.loads((two / "results.json").read_text())
    (grown / "experts.json").write_text(json.dumps({"tasks": a["tasks"]}))  # over 3 tasks: not the cut copy's
    cut = collect_runs.collect(grown, tmp_path / "cut", tasks=2)[0]
    assert not (cut / "experts.json").exists()
    for name in ("results.json", "config.json"):
        assert json.loads((cut / name).read_text()) == json.loads((two / name).read_text())
    assert _events(cut) == _events(two) != _events(grown)  # the third task's start evaluation sits at the boundary step
    with pytest.raises(ValueError, match="--tasks 4"):
        collect_runs.collect(grown, tmp_path / "none", tasks=4)
    assert not (tmp_path / "none").exists()
    # a copy that fails half way leaves the previous one as it was
    before = (cut / "results.json").read_text()
    def broken(*args: object) -> int:
        raise OSError("disk full")

    monkeypatch.setattr(collect_runs, "cut_events", broken)
    with pytest.raises(OSError, match="disk full"):
        collect_runs.collect(grown, tmp_path / "cut", tasks=2)
    assert (cut / "results.json").read_text() == before and _events(cut) == _events(two)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut", "grown", "two", "whole"]  # no half copy beside it


def _events(run: Path) -> list[tuple[str, int, float]]:
    """Every logged value of a run folder's TensorBoard files, in file and write order."""
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

    return [
        (v.tag, e.step, v.simple_value)
        for f in sorted((run / "tb").glob("events.out.tfevents.*"))
        for e in LegacyEventFileLoader(str(f)).Load()
        for v in e.summary.value
    ]


def test_tasks_beyond_the_suite_or_fewer_than_stored_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    common = ["--suite", "smoke", "--method", "topk", "--steps-per-task", "128", "--run-dir", str(run), *TINY]
    assert main([*common, "--tasks", "2"]) == 0
    before = (run / "results.json").read_text()
    capsys.readouterr()
    assert main([*common, "--tasks", "9"]) == 2
    assert "--tasks must be in 1..3 for suite 'smoke', got 9" in capsys.readouterr().err
    assert main([*common, "--tasks", "1"]) == 2
    assert "--tasks 1 conflicts with the resumed run's stored 2" in capsys.readouterr().err
    assert (run / "results.json").read_text() == before
