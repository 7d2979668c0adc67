"""Training is unchanged, bit for bit: fixed-seed runs (2-task ``cw10`` runs of Top-K and of SPHERE
on real MetaWorld, tiny ones on the former network and full-size ones on the slice's, the authors'
network; and a TD3 smoke run) must give the weights, TensorBoard scalars and
``results.json`` numbers recorded in ``tests/data/training_fingerprints.json``.

A refactor of the update path, the suite path or the scheduler lands only with this test green, so
runs from before and after it stay one experiment (docs/contributing.md). Bit-identical numbers are
expected only where the same CPU kernels run: each recording names the machine it was made on
(:func:`rl_moe.fingerprint.kernel_machine`: the CPU model and instruction-set flags, torch's
version and CPU capability, MKL, oneDNN, numpy and MuJoCo). Elsewhere the comparison skips with a
line naming the difference, and :func:`test_identical_runs_give_identical_fingerprints` checks,
on any machine, that training is deterministic there.

After a change that is meant to change training, record them again (this replaces the recording of
this machine, or adds one for it; the others stay as they are):

    RL_MOE_RECORD_FINGERPRINTS=1 OMP_NUM_THREADS=1 python -m pytest tests/test_training_fingerprint.py -m "slow or not slow" -p no:xdist
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from rl_moe.fingerprint import fingerprint, kernel_machine, machine_differences

DATA = Path(__file__).parent / "data" / "training_fingerprints.json"
RECORD = os.environ.get("RL_MOE_RECORD_FINGERPRINTS") == "1"
_FEW_EVALS = ("--set", "eval.evals_per_task=1", "--set", "eval.n_episodes=1", "--set", "eval.matrix_episodes=1", "--set", "eval.n_envs=1")
#: The settings cw10 trained with before its default became the authors' network and SPHERE's
#: default the authors' lambda arithmetic: the runs recorded before then keep them, so their
#: recordings on every machine still say whether the training code changed.
_FORMER = ("--set", "net.init=orthogonal", "--set", "reg.sphere.norm_eps=0", "--set", "reg.sphere.log_std_in_theta=false")
_FORMER_TOPK = _FORMER[:2]
#: The slice's network (cw10's defaults: the authors' network and arithmetic, the online probe)
#: at full size, with rollouts of 8 x 64 steps so that a run takes about a minute.
_SLICE_NET = ("--tasks", "2", "--steps-per-task", "1024", "--set", "ppo.n_steps=64", "--set", "ppo.batch_size=128", "--set", "ppo.n_epochs=2", "--set", "probe.online=true", *_FEW_EVALS)
#: name -> the run's arguments (besides --run-dir); the "full" ones are the issue's 2 tasks x 32k steps
RUNS: dict[str, tuple[str, ...]] = {
    "cw10-topk-tiny": ("--suite", "cw10", "--method", "topk", "--tasks", "2", "--steps-per-task", "512", "--preset", "tiny", *_FEW_EVALS, *_FORMER_TOPK),
    "cw10-sphere-tiny": ("--suite", "cw10", "--method", "sphere", "--tasks", "2", "--steps-per-task", "512", "--preset", "tiny", *_FEW_EVALS, *_FORMER),
    "smoke-td3-tiny": ("--suite", "smoke", "--algo", "td3", "--method", "topk", "--tasks", "2", "--steps-per-task", "600", "--preset", "tiny"),
    "cw10-topk-authors": ("--suite", "cw10", "--method", "topk", *_SLICE_NET),
    "cw10-sphere-authors": ("--suite", "cw10", "--method", "sphere", *_SLICE_NET),
    "cw10-topk-full": ("--suite", "cw10", "--method", "topk", "--tasks", "2", "--steps-per-task", "32768", "--preset", "sb3"),
    "cw10-sphere-full": ("--suite", "cw10", "--method", "sphere", "--tasks", "2", "--steps-per-task", "32768", "--preset", "sb3", *_FORMER[2:]),
}
#: Short runs for the determinism check: PPO with SPHERE's penalty over Top-K routing, and TD3.
SAME_TWICE: dict[str, tuple[str, ...]] = {
    "smoke-ppo-sphere": ("--suite", "smoke", "--algo", "ppo", "--method", "sphere", "--tasks", "2", "--steps-per-task", "512", "--preset", "tiny"),
    "smoke-td3-tiny": RUNS["smoke-td3-tiny"],
}


def _train(args: tuple[str, ...], run: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    from rl_moe.crl import main

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert main([*args, "--vec-env", "dummy", "--threads", "1", "--no-progress", "--run-dir", str(run)]) == 0
    return fingerprint(run)


def _recordings() -> list[dict[str, Any]]:
    return json.loads(DATA.read_text())["recordings"] if DATA.is_file() else []


def _this_machines(recordings: list[dict[str, Any]], here: dict[str, str]) -> dict[str, Any] | None:
    return next((r for r in recordings if not machine_differences(r["machine"], here)), None)


def _not_here(recordings: list[dict[str, Any]], here: dict[str, str]) -> str:
    """One line: how this machine differs from each machine the fingerprints were recorded on."""
    if not recordings:
        return "no fingerprints are recorded (see the module docstring)"
    each = [f"{r['machine'].get('cpu', 'a CPU')} with torch {r['machine'].get('torch', '?')}: {'; '.join(machine_differences(r['machine'], here))}" for r in recordings]
    return "fingerprints recorded with other CPU kernels, so bit-identical results are not expected here (" + " | ".join(each) + ")"


def test_a_machine_that_differs_only_in_flags_is_named_by_them() -> None:
    """The skip line names what differs: the Xeon on which the fingerprints failed had the same
    "AVX512" capability as the recording, and differed in its AMX and AVX512-FP16 flags."""
    here = kernel_machine()
    other = {**here, "cpu_flags": " ".join(sorted({*here["cpu_flags"].split(), "amx_tile", "avx512_fp16"} - {"avx2"}))}
    assert machine_differences(here, dict(here)) == []
    diff = machine_differences(other, here)
    assert len(diff) == 1 and diff[0].startswith("CPU instruction-set flags: this machine")
    assert ("avx2" in here["cpu_flags"].split()) == ("adds avx2" in diff[0])
    assert machine_differences({"cpu_capability": here["cpu_capability"], "torch": here["torch"]}, here) == [
        "the recording does not say its CPU model, CPU instruction-set flags, MKL, oneDNN, numpy, MuJoCo"
    ]
    line = _not_here([{"machine": {**here, "numpy": "0.0"}}], here)
    assert f"numpy 0.0 there, {here['numpy']} here" in line and "\n" not in line


def test_the_machine_is_described_from_cpuinfo_and_torchs_build() -> None:
    cpuinfo = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 207\nmodel name\t: Intel(R) Xeon(R) Processor\n"
    cpuinfo += "flags\t\t: fpu sse sse2 avx2 md_clear hypervisor amx_tile avx512_fp16 flush_l1d\n\nprocessor\t: 1\nflags\t\t: sse\n"
    config = "  - Intel(R) oneAPI Math Kernel Library Version 2024.2-Product Build 20240605 for Intel(R) 64\n  - Intel(R) MKL-DNN v3.12.0 (Git Hash 80af)\n"
    m = kernel_machine(cpuinfo, config)
    assert m["cpu"] == "Intel(R) Xeon(R) Processor (GenuineIntel family 6 model 207)"
    assert m["cpu_flags"] == "amx_tile avx2 avx512_fp16 sse sse2"  # mitigation and hypervisor flags left out
    assert (m["mkl"], m["onednn"]) == ("2024.2 build 20240605", "3.12.0")
    assert set(m) == {"cpu", "cpu_flags", "cpu_capability", "torch", "mkl", "onednn", "numpy", "mujoco"}


@pytest.mark.parametrize("name", list(SAME_TWICE))
def test_identical_runs_give_identical_fingerprints(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs on any machine: the same command twice trains bit for bit alike here (what the recorded
    fingerprints rest on), and a run of another seed does not (the fingerprint sees training)."""
    first = _train(SAME_TWICE[name], tmp_path / "a", monkeypatch)
    assert _train(SAME_TWICE[name], tmp_path / "b", monkeypatch) == first
    if name == "smoke-ppo-sphere":
        other = _train((*SAME_TWICE[name], "--seed", "1"), tmp_path / "c", monkeypatch)
        assert other["weights"] != first["weights"] and other["results"] != first["results"]


@pytest.mark.parametrize(
    "name", [n if not n.endswith("-full") else pytest.param(n, marks=pytest.mark.slow) for n in RUNS]
)
def test_training_matches_the_recorded_fingerprint(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if RECORD and os.environ.get("PYTEST_XDIST_WORKER"):  # two workers rewriting one file lose entries
        pytest.fail("record the fingerprints in one process: add -p no:xdist (or leave out -n)")
    here, recordings = kernel_machine(), _recordings()
    recording = _this_machines(recordings, here)
    if not RECORD and recording is None:
        pytest.skip(_not_here(recordings, here))
    got = _train(RUNS[name], tmp_path / name, monkeypatch)
    if RECORD:
        if recording is None:
            recording = {"machine": here, "how": "recorded with RL_MOE_RECORD_FINGERPRINTS=1", "runs": {}}
            recordings.append(recording)
        recording["runs"][name] = got
        DATA.write_text(json.dumps({"recordings": recordings}, indent=2, sort_keys=True) + "\n")
        return
    assert recording is not None
    if name not in recording["runs"]:
        pytest.skip(f"{name} is not recorded for this machine (its recording has {', '.join(sorted(recording['runs']))})")
    want = recording["runs"][name]
    assert {k: got[k] == want[k] for k in want} == {k: True for k in want}, (got, want)
