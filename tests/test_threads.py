"""Thread choice under ``--threads`` (rl_moe.envs.threads): one torch thread on the official envs,
two on EnvPool only while the load leaves two cores free, and the user's OMP_NUM_THREADS kept."""

from __future__ import annotations

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
