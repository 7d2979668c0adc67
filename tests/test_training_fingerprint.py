"""Training is unchanged, bit for bit: fixed-seed runs (a 2-task ``cw10`` run of Top-K and of SPHERE
on real MetaWorld, and a TD3 smoke run) must give the weights, TensorBoard scalars and
``results.json`` numbers recorded in ``tests/data/training_fingerprints.json``.

A refactor of the update path, the suite path or the scheduler lands only with this test green, so
runs from before and after it stay one experiment (docs/contributing.md). The numbers hold for the
CPU kernels they were recorded with (torch's CPU capability and version); elsewhere the test skips
and says why. After a change that is meant to change training, record them again:

    RL_MOE_RECORD_FINGERPRINTS=1 OMP_NUM_THREADS=1 python -m pytest tests/test_training_fingerprint.py -m "slow or not slow" -p no:xdist
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from rl_moe.fingerprint import fingerprint

DATA = Path(__file__).parent / "data" / "training_fingerprints.json"
RECORD = os.environ.get("RL_MOE_RECORD_FINGERPRINTS") == "1"
_FEW_EVALS = ("--set", "eval.evals_per_task=1", "--set", "eval.n_episodes=1", "--set", "eval.matrix_episodes=1", "--set", "eval.n_envs=1")
#: name -> the run's arguments (besides --run-dir); the "full" ones are the issue's 2 tasks x 32k steps
RUNS: dict[str, tuple[str, ...]] = {
    "cw10-topk-tiny": ("--suite", "cw10", "--method", "topk", "--tasks", "2", "--steps-per-task", "512", "--preset", "tiny", *_FEW_EVALS),
    "cw10-sphere-tiny": ("--suite", "cw10", "--method", "sphere", "--tasks", "2", "--steps-per-task", "512", "--preset", "tiny", *_FEW_EVALS),
    "smoke-td3-tiny": ("--suite", "smoke", "--algo", "td3", "--method", "topk", "--tasks", "2", "--steps-per-task", "600", "--preset", "tiny"),
    "cw10-topk-full": ("--suite", "cw10", "--method", "topk", "--tasks", "2", "--steps-per-task", "32768"),
    "cw10-sphere-full": ("--suite", "cw10", "--method", "sphere", "--tasks", "2", "--steps-per-task", "32768"),
}


def _machine() -> dict[str, str]:
    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__}


@pytest.mark.parametrize(
    "name", [n if not n.endswith("-full") else pytest.param(n, marks=pytest.mark.slow) for n in RUNS]
)
def test_training_matches_the_recorded_fingerprint(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rl_moe.crl import main

    if RECORD and os.environ.get("PYTEST_XDIST_WORKER"):  # two workers rewriting one file lose entries
        pytest.fail("record the fingerprints in one process: add -p no:xdist (or leave out -n)")
    stored = json.loads(DATA.read_text()) if DATA.is_file() else {"machine": _machine(), "runs": {}}
    if not RECORD and stored["machine"] != _machine():
        pytest.skip(f"fingerprints recorded on {stored['machine']}, this machine is {_machine()}")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    run = tmp_path / name
    assert main([*RUNS[name], "--vec-env", "dummy", "--threads", "1", "--no-progress", "--run-dir", str(run)]) == 0
    got = fingerprint(run)
    if RECORD:
        stored["machine"] = _machine()
        stored["runs"][name] = got
        DATA.write_text(json.dumps(stored, indent=2, sort_keys=True) + "\n")
        return
    assert name in stored["runs"], f"no fingerprint recorded for {name}; record them (see the module docstring)"
    want = stored["runs"][name]
    assert {k: got[k] == want[k] for k in want} == {k: True for k in want}, (got, want)
