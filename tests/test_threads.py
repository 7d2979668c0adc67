"""Thread choice under ``--threads`` (rl_moe.envs.threads): one torch thread on the official envs,
two on EnvPool only while the load leaves two cores free, and the user's OMP_NUM_THREADS kept."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rl_moe.envs import threads
from rl_moe.envs.threads import AUTO_TORCH_THREADS, ThreadGovernor, ThreadPlan, auto_torch_threads, thread_plan


def test_auto_gives_the_official_envs_one_thread_whatever_the_load() -> None:
    plan, note = thread_plan(None, env={}, cores=8)
    assert plan.auto and note is None
    for others in (0.0, 1.0, 7.5):
        assert plan.for_task(native=False, others=others) == 1


@pytest.mark.parametrize(("cores", "others", "expected"), [(2, 0.0, 2), (2, 0.4, 2), (2, 1.0, 1), (2, 2.0, 1), (4, 1.0, 2), (1, 0.0, 1)])
def test_auto_on_a_native_pool_takes_two_threads_only_with_two_free_cores(cores: int, others: float, expected: int) -> None:
    assert AUTO_TORCH_THREADS == 2
    assert auto_torch_threads(cores, others) == expected
    assert ThreadPlan(True, 1, cores).for_task(native=True, others=others) == expected


def test_a_users_omp_num_threads_is_kept_and_an_override_is_said() -> None:
    plan, note = thread_plan(None, env={"OMP_NUM_THREADS": "3"}, cores=8)
    assert not plan.auto and plan.for_task(native=True, others=0.0) == 3 and note is None
    plan, note = thread_plan(2, env={"OMP_NUM_THREADS": "1"}, cores=8)
    assert plan.for_task(native=False) == 2
    assert note == "note: --threads 2 overrides OMP_NUM_THREADS=1 for torch"
    assert thread_plan(1, env={"OMP_NUM_THREADS": "1"})[1] is None


def test_governor_sets_threads_per_task_and_drops_to_one_under_load(monkeypatch: pytest.MonkeyPatch) -> None:
    before = torch.get_num_threads()
    try:
        load = {"now": 0.0}
        monkeypatch.setattr(threads, "busy_cores", lambda: load["now"])
        plan = ThreadPlan(True, 1, cores=2)
        official = ThreadGovernor(plan, native=False)
        official._on_training_start()
        assert torch.get_num_threads() == 1
        native = ThreadGovernor(plan, native=True)
        native._on_training_start()
        assert torch.get_num_threads() == 2
        load["now"] = 3.0  # another process started beside the run
        native._on_rollout_start()
        assert torch.get_num_threads() == 1
        load["now"] = 0.0
        native._on_rollout_start()
        assert torch.get_num_threads() == 2
        load["now"] = 3.0  # ... and one that starts during a rollout: the update runs on one thread
        native._on_rollout_end()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def _groups(tmp_path: Path, lines: str, files: dict[str, str]) -> tuple[Path, Path]:
    """A fake ``/proc/self/cgroup`` and cgroup mount with the given files under it."""
    proc, root = tmp_path / "cgroup", tmp_path / "fs"
    tmp_path.mkdir(parents=True, exist_ok=True)
    proc.write_text(lines)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return proc, root


def test_a_cgroup_quota_is_read_from_the_tightest_group(tmp_path: Path) -> None:
    # v2: the process's own group sets none, the one above it 1.5 CPUs, the root 3
    proc, root = _groups(tmp_path / "v2", "0::/a/b\n", {"a/b/cpu.max": "max 100000\n", "a/cpu.max": "150000 100000\n", "cpu.max": "300000 100000\n"})
    assert threads.cgroup_cpu_quota(proc, root) == 1.5
    # v1's cpu controller (mounted as cpu,cpuacct), other controllers' lines beside it
    proc, root = _groups(
        tmp_path / "v1", "4:memory:/docker/x\n3:cpu,cpuacct:/docker/x\n0::/\n",
        {"cpu,cpuacct/docker/x/cpu.cfs_quota_us": "200000\n", "cpu,cpuacct/docker/x/cpu.cfs_period_us": "100000\n",
         "cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n", "memory/docker/x/cpu.max": "50000 100000\n"},
    )  # fmt: skip
    assert threads.cgroup_cpu_quota(proc, root) == 2.0
    # no quota anywhere, or no cgroup files at all
    proc, root = _groups(tmp_path / "none", "0::/\n1:cpu:/\n", {"cpu.max": "max 100000\n", "cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"})
    assert threads.cgroup_cpu_quota(proc, root) is None
    assert threads.cgroup_cpu_quota(tmp_path / "missing", root) is None


@pytest.mark.parametrize(("quota", "expected"), [(None, 4), (0.5, 1), (1.5, 1), (2.0, 2), (16.0, 4)])
def test_available_cores_are_the_affinity_capped_by_the_quota(quota: float | None, expected: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(threads, "cgroup_cpu_quota", lambda: quota)
    assert threads.available_cores() == expected
