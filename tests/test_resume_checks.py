"""Damaged run folders are refused before a resume writes anything (exit 2, one line)."""

from __future__ import annotations

import json
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from rl_moe.crl import main
from rl_moe.rundir import RunDir

TINY = ["--suite", "smoke", "--method", "topk", "--preset", "tiny", "--no-progress", "--tasks", "2", "--steps-per-task", "128"]


@pytest.fixture(scope="module")
def partial(tmp_path_factory: pytest.TempPathFactory, stop_before_task) -> Path:
    """A 2-task run stopped (Ctrl-C) after task 1: resumable."""
    run = tmp_path_factory.mktemp("partial") / "run"
    assert stop_before_task([*TINY, "--run-dir", str(run)], 1) == 130
    return run


def _edit_results(**fields: object) -> Callable[[Path], None]:
    def edit(run: Path) -> None:
        data = json.loads(RunDir(run).results.read_text())
        data.update(fields)
        RunDir(run).results.write_text(json.dumps(data))

    return edit


def _garbage_weights(run: Path) -> None:
    ckpt = RunDir(run).checkpoint(0, "pendulum-0")
    with zipfile.ZipFile(ckpt) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    members["policy.pth"] = b"not a torch file" * 10
    with zipfile.ZipFile(ckpt, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)


def _other_network(run: Path) -> None:
    # A checkpoint of the same suite trained with 3 experts (the run has 4): a valid zip, the wrong shapes.
    other = run.parent / "other"
    assert main([*TINY, "--tasks", "1", "--set", "net.n_experts=3", "--run-dir", str(other)]) == 0
    shutil.copy(RunDir(other).checkpoint(0, "pendulum-0"), RunDir(run).checkpoint(0, "pendulum-0"))
    shutil.rmtree(other)


def _narrow_probe(run: Path) -> None:
    torch.save(torch.zeros(32, 5), RunDir(run).probe_states)


def _bad_method(run: Path) -> None:
    data = json.loads(RunDir(run).config.read_text())
    data["method"] = "nope"
    RunDir(run).config.write_text(json.dumps(data, indent=2) + "\n")


DAMAGE = {
    "eval_curves is a list": (_edit_results(eval_curves=[]), "eval_curves is not a mapping"),
    "task_segments is a string": (_edit_results(task_segments="x"), "task_segments is not a list"),
    "garbage policy.pth": (_garbage_weights, "has unreadable weights"),
    "another network size": (_other_network, "does not fit config.json's network"),
    "probe batch of the wrong width": (_narrow_probe, "probe_states.pt holds 5-dim states, the env gives 3"),
    "unknown method in config.json": (_bad_method, "unknown method 'nope'"),
}


@pytest.mark.parametrize("what", list(DAMAGE))
def test_damaged_run_folder_is_refused_before_anything_is_written(what: str, partial: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    damage, message = DAMAGE[what]
    run = tmp_path / "run"
    shutil.copytree(partial, run)
    damage(run)
    before = {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
    capsys.readouterr()
    assert main(["--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()} == before


def test_the_undamaged_copy_resumes(partial: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(partial, run)
    assert main(["--resume", str(run), "--no-progress"]) == 0
    assert json.loads(RunDir(run).results.read_text())["complete"]
