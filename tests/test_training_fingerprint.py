"""Training is unchanged, bit for bit: fixed-seed runs (a 2-task ``cw10`` run of Top-K and of SPHERE
on real MetaWorld, and a TD3 smoke run) must give the weights, TensorBoard scalars and
``results.json`` numbers recorded in ``tests/data/training_fingerprints.json``.

A refactor of the update path, the suite path or the scheduler lands only with this test green, so
runs from before and after it stay one experiment (docs/contributing.md). The numbers hold for the
CPU kernels they were recorded with (torch's CPU capability and version); elsewhere the test skips
and says why. After a change that is meant to change training, record them again:

    RL_MOE_RECORD_FINGERPRINTS=1 OMP_NUM_THREADS=1 python -m pytest tests/test_training_fingerprint.py -m "slow or not slow"
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from stable_baselines3.common.save_util import load_from_zip_file

from tests.test_diagnostics_probe import read_scalars

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
_RESULT_KEYS = ("tasks", "steps_per_task", "success_matrix", "own_success", "final_success", "eval_curves", "cl_metrics", "task_segments")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def fingerprint(run: Path) -> dict[str, str]:
    """Digests of a finished run: every checkpoint's weights (policy and optimizer), every
    TensorBoard scalar but wall-clock timings, and results.json's numbers."""
    weights = hashlib.sha256()
    for ckpt in sorted((run / "checkpoints").glob("*.zip")):
        _, params, _ = load_from_zip_file(str(ckpt), device="cpu")
        for part in sorted(params):
            state = params[part]
            for key in sorted(state):  # optimizer states nest dicts and lists of tensors
                weights.update(f"{ckpt.name}/{part}/{key}".encode())
                weights.update(repr(_flat(state[key])).encode())
    scalars = {tag: points for tag, points in read_scalars(run / "tb").items() if not tag.startswith("time/")}
    results = json.loads((run / "results.json").read_text())
    return {
        "weights": weights.hexdigest()[:16],
        "scalars": _digest(repr(sorted((t, [(s, np.float32(v).tobytes().hex()) for s, v in p]) for t, p in scalars.items())).encode()),
        "scalar_tags": str(len(scalars)),
        "results": _digest(json.dumps({k: results[k] for k in _RESULT_KEYS}, sort_keys=True).encode()),
    }


def _flat(value: object) -> object:
    """Tensors as their bytes, containers walked in order (a digest of the exact values)."""
    if isinstance(value, torch.Tensor):
        return (str(value.dtype), tuple(value.shape), value.detach().contiguous().numpy().tobytes().hex())
    if isinstance(value, dict):
        return [(str(k), _flat(value[k])) for k in sorted(value, key=str)]
    if isinstance(value, (list, tuple)):
        return [_flat(v) for v in value]
    return repr(value)


def _machine() -> dict[str, str]:
    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__}


@pytest.mark.parametrize(
    "name", [n if not n.endswith("-full") else pytest.param(n, marks=pytest.mark.slow) for n in RUNS]
)
def test_training_matches_the_recorded_fingerprint(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rl_moe.crl import main

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
