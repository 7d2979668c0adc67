"""Reliability guarantees of a continual run (docs/continual.md, "Guarantees"): the NaN guard,
exact resumes, no task lost to an interruption, atomic run files, TensorBoard steps."""

from __future__ import annotations

import json
import math
import stat
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from stable_baselines3.common.save_util import load_from_zip_file

from rl_moe.algos.guard import NonFiniteError, check_update, first_non_finite
from rl_moe.continual import scheduler as sched_mod
from rl_moe.crl import main
from rl_moe.rundir import RunDir

TINY = ["--suite", "smoke", "--preset", "tiny", "--no-progress", "--tasks", "2", "--steps-per-task", "256"]


def _state_tensors(run: Path, i: int) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    _, params, _ = load_from_zip_file(RunDir(run).checkpoint(i, f"pendulum-{i}"), device="cpu")
    for part, sd in params.items():
        if part.endswith("optimizer"):
            for pid, st in sd["state"].items():
                for k, v in st.items():
                    out[f"{part}.{pid}.{k}"] = torch.as_tensor(v)
        else:
            out.update({f"{part}.{k}": v for k, v in sd.items()})
    return out


def _same_run(a: Path, b: Path, n: int) -> None:
    for i in range(n):
        wa, wb = _state_tensors(a, i), _state_tensors(b, i)
        assert wa.keys() == wb.keys()
        diff = {k: float((wa[k].double() - wb[k].double()).abs().max()) for k in wa if not torch.equal(wa[k], wb[k])}
        assert not diff, f"task {i} differs: {diff}"
    ra, rb = (json.loads((p / "results.json").read_text()) for p in (a, b))
    assert ra["success_matrix"] == rb["success_matrix"] and ra["eval_curves"] == rb["eval_curves"]
    # TensorBoard too: every evaluation point and the episode statistics of rollouts after the cut.
    sa, sb = _scalars(a), _scalars(b)
    for tag in ("eval/success", "eval/return", "rollout/ep_rew_mean", "rollout/ep_len_mean"):
        assert sa.get(tag) == sb.get(tag), tag


def _scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


# ---- item 2 + 4: an interrupted and resumed run equals the uninterrupted one ---------------
def _argv(algo: str) -> list[str]:
    argv = [*TINY, "--algo", algo, "--method", "sphere"]
    # TD3 takes a gradient step per env step: a shorter task keeps it seconds-fast.
    return argv + ["--steps-per-task", "144", "--set", "td3.learning_starts=48"] if algo == "td3" else argv


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One uninterrupted run per algo, shared by the interruption variants."""
    runs = {}
    for algo in ("ppo", "td3"):
        runs[algo] = tmp_path_factory.mktemp(f"full-{algo}")
        assert main([*_argv(algo), "--run-dir", str(runs[algo])]) == 0
    return runs


@pytest.mark.parametrize("algo", ["ppo", "td3"])
@pytest.mark.parametrize("where", ["before_task", "during_end_eval"])
def test_interrupted_and_resumed_run_is_bit_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uninterrupted: dict[str, Path], algo: str, where: str
) -> None:
    argv = _argv(algo)
    full = uninterrupted[algo]

    trained: list[int] = []
    original_train, original_row = sched_mod.ContinualScheduler._train_task, sched_mod.ContinualScheduler._evaluate_row
    state = {"interrupted": False}

    def train(self, task, probe):  # type: ignore[no-untyped-def]
        trained.append(task.index)
        if where == "before_task" and task.index == 1 and not state["interrupted"]:
            state["interrupted"] = True
            raise KeyboardInterrupt
        original_train(self, task, probe)

    def row(self, i):  # type: ignore[no-untyped-def]
        if where == "during_end_eval" and i == 0 and not state["interrupted"]:
            state["interrupted"] = True
            raise KeyboardInterrupt  # Ctrl-C after the checkpoint, during the evaluation
        return original_row(self, i)

    monkeypatch.setattr(sched_mod.ContinualScheduler, "_train_task", train)
    monkeypatch.setattr(sched_mod.ContinualScheduler, "_evaluate_row", row)
    cut = tmp_path / "cut"
    assert main([*argv, "--run-dir", str(cut)]) == 130
    partial = json.loads((cut / "results.json").read_text())
    assert partial["finished_tasks"] == 1  # the checkpoint was durable: the task is not lost
    assert partial["evaluated_tasks"] == (0 if where == "during_end_eval" else 1)
    assert main(["--resume", str(cut), "--no-progress"]) == 0
    assert trained.count(0) == 1  # task 0 never trained again
    _same_run(full, cut, 2)


# ---- item 1: the NaN guard ---------------------------------------------------------------
def test_guard_names_the_first_non_finite_term() -> None:
    assert first_non_finite({"train/loss": 1.0, "eval/x": math.nan}) is None  # train/* only
    assert first_non_finite({"train/loss": 1.0, "train/loss_sphere": math.nan}) == ("train/loss_sphere", pytest.approx(math.nan, nan_ok=True))
    # Build order, not logging order: the entropy term logged first was NaN only because of the penalty.
    logged = {"train/entropy_loss": math.nan, "train/policy_gradient_loss": math.nan, "train/value_loss": math.nan, "train/loss_sphere": math.nan, "train/coef_sphere": 0.5}
    assert first_non_finite(logged)[0] == "train/loss_sphere"
    assert first_non_finite({"train/entropy_loss": math.nan, "train/value_loss": math.inf})[0] == "train/value_loss"
    p = torch.nn.Parameter(torch.ones(3))
    check_update({"train/loss": 2.0}, [p])
    p.grad = torch.tensor([0.0, math.inf, 0.0])
    with pytest.raises(NonFiniteError, match="policy parameters became nan"):
        check_update({"train/loss": 2.0}, [p])


def test_parameter_check_agrees_with_isfinite_on_every_kind_of_bad_value() -> None:
    from rl_moe.algos.guard import parameters_finite

    gen = torch.Generator().manual_seed(0)
    for bad in (math.nan, math.inf, -math.inf):
        for where in ("weight", "grad"):
            for pos in range(0, 60, 7):
                params = [torch.nn.Parameter(torch.randn(3, 4, 5, generator=gen)), torch.nn.Parameter(torch.zeros(0)), torch.nn.Parameter(torch.randn((), generator=gen))]
                params[0].grad = torch.randn(3, 4, 5, generator=gen)
                assert parameters_finite(params)
                target = params[0].data if where == "weight" else params[0].grad
                target.view(-1)[pos] = bad
                brute = all(torch.isfinite(t).all() for p in params for t in (p.data, p.grad) if t is not None)
                assert parameters_finite(params) is bool(brute) is False, (bad, where, pos)


@pytest.mark.parametrize("algo", ["ppo", "td3"])
def test_divergence_exits_3_with_one_line_and_resumes_after_a_fix(tmp_path: Path, capsys: pytest.CaptureFixture, algo: str) -> None:
    run = tmp_path / "run"
    lr = "ppo.lr_start=1e3" if algo == "ppo" else "td3.lr=1e12"
    steps = "256" if algo == "ppo" else "128"  # PPO: two updates (the first one ends with huge but finite weights)
    argv = [*TINY, "--algo", algo, "--run-dir", str(run), "--tasks", "1", "--steps-per-task", steps, "--set", "td3.learning_starts=48"]
    first = main([*argv, "--set", lr])
    err = capsys.readouterr().err.strip().splitlines()
    assert first == 3, err
    assert len(err) == 1 and "became" in err[0] and "at step" in err[0] and "in task 1 (pendulum-0)" in err[0] and "Traceback" not in err[0]
    res = json.loads((run / "results.json").read_text())
    assert res["finished_tasks"] == 0 and not res["complete"]
    # Resumable once the setting is changed: the stored config takes the new value.
    good = "ppo.lr_start=1e-3" if algo == "ppo" else "td3.lr=1e-3"
    assert main(["--resume", str(run), "--no-progress", "--set", good]) == 0
    cfg = json.loads((run / "config.json").read_text())
    assert (cfg["ppo"]["lr_start"] if algo == "ppo" else cfg["td3"]["lr"]) == 1e-3
    assert json.loads((run / "results.json").read_text())["complete"]


def test_a_nan_penalty_is_named_as_the_term_that_diverged(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from rl_moe.regularizers.sphere import Sphere

    original = Sphere.network_loss
    calls = [0]

    def nan_after_a_while(self, out, reference=None):  # type: ignore[no-untyped-def]
        calls[0] += 1
        loss = original(self, out, reference)
        return loss * math.nan if calls[0] > 3 else loss

    monkeypatch.setattr(Sphere, "network_loss", nan_after_a_while)
    assert main([*TINY, "--method", "sphere", "--run-dir", str(tmp_path / "run"), "--tasks", "1", "--steps-per-task", "256"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train/loss_sphere became nan" in err[0], err


def test_a_failing_probe_metric_warns_and_training_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rl_moe.diagnostics import probe as probe_mod

    def broken(self):  # type: ignore[no-untyped-def]
        raise torch.linalg.LinAlgError("linalg.eigh: The algorithm failed to converge")

    monkeypatch.setattr(probe_mod.PlasticityProbe, "compute", broken)
    with pytest.warns(RuntimeWarning, match="plasticity probe failed"):
        assert main([*TINY, "--run-dir", str(tmp_path / "run")]) == 0


# ---- item 3: atomic run files; a folder killed during creation restarts -------------------
@pytest.mark.parametrize("content", ["", '{"suite": "smo'])
def test_partial_config_without_finished_task_restarts_with_the_same_command(tmp_path: Path, content: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(content)  # killed while the folder was being created
    assert main([*TINY, "--run-dir", str(run)]) == 0
    assert json.loads((run / "config.json").read_text())["suite"] == "smoke"


def test_run_files_are_world_readable(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert main([*TINY, "--tasks", "1", "--run-dir", str(run)]) == 0
    for path in [run / "results.json", run / "config.json", *(run / "checkpoints").iterdir()]:
        assert stat.S_IMODE(path.stat().st_mode) & 0o044 == 0o044, path


# ---- item 5: strictly increasing TensorBoard steps, also across a resume ------------------
def _steps(tb: Path) -> dict[str, list[int]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb), purge_orphaned_data=True)
    acc.Reload()
    return {tag: [e.step for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _raw_steps(tb: Path) -> dict[str, list[int]]:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    out: dict[str, list[int]] = defaultdict(list)
    for f in sorted(tb.glob("events.*")):
        for ev in EventFileLoader(str(f)).Load():
            for v in ev.summary.value:
                out[v.tag].append(ev.step)
    return out


def test_tensorboard_steps_strictly_increase_and_a_resume_never_rewinds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    assert main([*TINY, "--run-dir", str(run)]) == 0
    for tag, steps in _raw_steps(run / "tb").items():
        assert all(b > a for a, b in zip(steps, steps[1:])), (tag, steps)

    original = sched_mod.ContinualScheduler._evaluate_row

    def stop_late(self, i):  # type: ignore[no-untyped-def]
        if i == 1:
            raise KeyboardInterrupt  # task 1 trained and logged, then interrupted
        return original(self, i)

    cut = tmp_path / "cut"
    monkeypatch.setattr(sched_mod.ContinualScheduler, "_evaluate_row", stop_late)
    assert main([*TINY, "--run-dir", str(cut)]) == 130
    monkeypatch.setattr(sched_mod.ContinualScheduler, "_evaluate_row", original)
    res = json.loads((cut / "results.json").read_text())
    res.update(finished_tasks=1, evaluated_tasks=1, global_step=res["task_segments"][0][1], task_segments=res["task_segments"][:1])
    res["eval_curves"].pop("pendulum-1")
    (cut / "results.json").write_text(json.dumps(res))  # as if interrupted during task 1's training
    assert main(["--resume", str(cut), "--no-progress"]) == 0
    raw = _raw_steps(cut / "tb")  # the files as written, with nothing for a reader to purge
    assert raw["train/loss"] == _raw_steps(run / "tb")["train/loss"]
    for tag, s in raw.items():
        assert all(b > a for a, b in zip(s, s[1:])), (tag, s)
    assert _steps(cut / "tb") == _steps(run / "tb")


def test_truncate_events_keeps_what_came_before_and_survives_an_interrupted_rewrite(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    from rl_moe.tblog import truncate_events

    tb = tmp_path / "tb"
    with SummaryWriter(str(tb)) as w:
        for step in range(10):
            w.add_scalar("a", float(step), step)
    truncate_events(str(tb), 6)
    assert _raw_steps(tb)["a"] == [0, 1, 2, 3, 4, 5]
    assert len(list(tb.glob("events.*"))) == 1
    (tb / ".rewrite").mkdir()  # a rewrite cut off before it was marked done: discarded
    (tb / ".rewrite" / "events.out.tfevents.0.x").write_text("partial")
    truncate_events(str(tb), 4)
    assert _raw_steps(tb)["a"] == [0, 1, 2, 3] and not (tb / ".rewrite").exists()


def test_reports_read_old_purged_folders_quietly(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Folders written by earlier versions: a second file steps back (TensorBoard's purge_step)."""
    from torch.utils.tensorboard import SummaryWriter

    from rl_moe.report.scalars import load_scalars

    tb = tmp_path / "run" / "tb"
    with SummaryWriter(str(tb)) as w:
        for step in range(10):
            w.add_scalar("eval/success", 0.0, step)
    with SummaryWriter(str(tb), purge_step=5) as w:
        for step in range(5, 8):
            w.add_scalar("eval/success", 1.0, step)
    with caplog.at_level("WARNING"):
        curves = load_scalars(tmp_path / "run")
    assert list(curves["eval/success"].steps) == list(range(8))
    assert "out of order" not in caplog.text


@pytest.mark.parametrize("steps", [128, 200])  # shorter than a 200-step episode; ending with one
def test_td3_logs_each_task_once_with_increasing_steps(tmp_path: Path, steps: int) -> None:
    """SB3 writes TD3's logs at episode ends: a short task still logs its update, and a task
    ending on an episode end does not write its last step twice."""
    run = tmp_path / "run"
    argv = ["--suite", "smoke", "--preset", "tiny", "--no-progress", "--tasks", "2", "--algo", "td3"]
    assert main([*argv, "--steps-per-task", str(steps), "--run-dir", str(run)]) == 0
    raw = _raw_steps(run / "tb")
    assert raw["train/critic_loss"], sorted(raw)
    assert raw["train/critic_loss"][-1] <= 2 * steps
    for tag, s in raw.items():
        assert all(b > a for a, b in zip(s, s[1:])), (tag, s)


# ---- item 8: small things a user notices -------------------------------------------------
def test_quick_start_budget_is_whole_rollouts_and_results_record_the_steps_run(tmp_path: Path) -> None:
    import re

    from rl_moe.continual.resolve import RunRequest, resolve

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    steps = int(re.search(r"--suite cw10 --tasks 2 --steps-per-task (\d+)", readme).group(1))  # type: ignore[union-attr]
    cfg = resolve(RunRequest(suite="cw10", tasks=2, steps_per_task=steps))
    assert cfg.effective_steps_per_task == steps  # no silent overrun of the asked budget

    run = tmp_path / "run"
    assert main([*TINY, "--tasks", "1", "--steps-per-task", "100", "--run-dir", str(run)]) == 0
    res = json.loads((run / "results.json").read_text())
    assert res["steps_per_task"] == 128  # two envs x 64 steps: one whole rollout, as trained
    start, end = res["task_segments"][0]
    assert end - start == res["steps_per_task"]


def test_resume_refuses_conflicting_run_flags_and_prints_an_absolute_resume_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    original = sched_mod.ContinualScheduler._train_task

    def stop(self, task, probe):  # type: ignore[no-untyped-def]
        if task.index == 1:
            raise KeyboardInterrupt
        original(self, task, probe)

    monkeypatch.setattr(sched_mod.ContinualScheduler, "_train_task", stop)
    assert main([*TINY, "--run-dir", "rel/run"]) == 130
    err = capsys.readouterr().err
    assert f"--resume {tmp_path / 'rel' / 'run'}" in err
    monkeypatch.setattr(sched_mod.ContinualScheduler, "_train_task", original)
    before = sorted((p.relative_to(tmp_path), p.stat().st_mtime_ns) for p in (tmp_path / "rel").rglob("*"))
    conflicts = {
        "conflicts with the resumed run's stored": (["--method", "topk"], ["--algo", "td3"], ["--seed", "3"], ["--tasks", "1"],
                                                    ["--experts", "8"], ["--top-k", "1"], ["--vec-env", "subproc"]),
        "differs from --resume": (["--run-dir", "other/run"],),
        "valid choices: tiny": (["--preset", "nope"],),
    }  # fmt: skip
    for message, flags in conflicts.items():
        for flag in flags:
            assert main(["--resume", "rel/run", "--no-progress", *flag]) == 2, flag
            line = capsys.readouterr().err.strip()
            assert message in line and len(line.splitlines()) == 1, line
    for shape in ("net.n_experts=8", "net.hidden=64,64"):  # would make every checkpoint unloadable
        assert main(["--resume", "rel/run", "--no-progress", "--set", shape]) == 2
        line = capsys.readouterr().err.strip()
        assert f"--set {shape} cannot change a resumed run" in line and len(line.splitlines()) == 1, line
    assert sorted((p.relative_to(tmp_path), p.stat().st_mtime_ns) for p in (tmp_path / "rel").rglob("*")) == before
    assert not (tmp_path / "other").exists()
    # Same values are fine, and a forward-transfer reference is honoured on a resume.
    reference = tmp_path / "rel" / "run"
    # The same values again (as a re-run of the same command passes them) are fine too.
    again = ["--preset", "tiny", "--set", "net.hidden=32,32", "--set", "ppo.n_steps=64"]
    assert main(["--resume", "rel/run", "--no-progress", "--method", "sphere", "--seed", "0", "--tasks", "2", "--run-dir", "rel/run", "--reference", str(reference), *again]) == 0
    assert json.loads((reference / "config.json").read_text())["reference"] == str(reference.resolve())


def test_full_disk_during_a_run_says_what_was_kept_and_resumes(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from rl_moe import atomic as results_mod

    original = results_mod._replace_atomically

    def full_at_task_2(path: Path, write):  # type: ignore[no-untyped-def]
        if "task_01" in path.name:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return original(path, write)

    monkeypatch.setattr(results_mod, "_replace_atomically", full_at_task_2)
    run = tmp_path / "run"
    assert main([*TINY, "--run-dir", str(run)]) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device writing" in err[0] and "the 1 finished task(s)" in err[0], err
    assert f"resume with python -m rl_moe.crl --resume {run.resolve()}" in err[0]
    monkeypatch.setattr(results_mod, "_replace_atomically", original)
    assert main(["--resume", str(run), "--no-progress"]) == 0
    assert json.loads((run / "results.json").read_text())["complete"]


def test_episode_statistics_continue_across_a_resume(tmp_path: Path, stop_before_task) -> None:
    # rollout/ep_* average SB3's last episodes, which carry over from task to task in CRL; a
    # resumed model must start task 2 with the same ones (Pendulum episodes end every 200 steps
    # per env, so 512-step tasks finish some before the boundary).
    argv = [*TINY, "--method", "topk", "--steps-per-task", "512"]
    full = tmp_path / "full"
    assert main([*argv, "--run-dir", str(full)]) == 0
    cut = tmp_path / "cut"
    assert stop_before_task([*argv, "--run-dir", str(cut)], 1) == 130
    assert main(["--resume", str(cut), "--no-progress"]) == 0
    a, b = _scalars(full), _scalars(cut)
    boundary = json.loads((full / "results.json").read_text())["task_segments"][0][1]
    assert any(step > boundary for step, _ in a["rollout/ep_rew_mean"])
    assert a["rollout/ep_rew_mean"] == b["rollout/ep_rew_mean"]


def test_resume_rewrites_config_only_once_the_learner_loads_with_the_new_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, stop_before_task) -> None:
    """A --set that passes validation but with which the stored run does not load: one line,
    exit 2, every file as it was (config.json, TensorBoard), and the run still resumes."""
    run = tmp_path / "run"
    assert stop_before_task([*TINY, "--method", "topk", "--run-dir", str(run)], 1) == 130
    stored = (run / "config.json").read_text()
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}

    def broken_load(self, i):  # type: ignore[no-untyped-def]
        raise RuntimeError("Error(s) in loading state_dict for MoEActorCriticPolicy:\n\tsize mismatch for ...")

    with monkeypatch.context() as m:
        m.setattr(sched_mod.ContinualScheduler, "_load_finished", broken_load)
        capsys.readouterr()
        assert main(["--resume", str(run), "--no-progress", "--set", "ppo.lr_start=1e-4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the run does not load with the changed settings (RuntimeError: Error(s) in loading state_dict")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"} == before
    assert (run / "config.json").read_text() == stored  # the run is still resumable as it was
    assert main(["--resume", str(run), "--no-progress", "--set", "ppo.lr_start=1e-4"]) == 0
    assert json.loads((run / "config.json").read_text())["ppo"]["lr_start"] == 1e-4
