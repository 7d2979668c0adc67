"""Evaluation envs are built once per task and reused: memory stays flat across evaluations, and
a reused env scores the same goals as a freshly built one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rl_moe.continual.evaluation import EvalEnvs, evaluate, release_memory
from rl_moe.envs.factories import EnvFactory, task_factories
from rl_moe.envs.suites import load_suite


class _Policy:
    """A fixed deterministic policy with SB3's ``predict`` signature."""

    def __init__(self, act_dim: int) -> None:
        self.w = np.random.default_rng(0).normal(size=(39, act_dim)) * 0.1

    def predict(self, obs, deterministic=True):  # type: ignore[no-untyped-def]
        return np.tanh(obs[:, : self.w.shape[0]] @ self.w[: obs.shape[1]]), None


def _rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20


def _factories(n: int, seed: int, task: int = 0) -> list[EnvFactory]:
    """Eval factories of a CW10 task with 25-step episodes (seconds-fast)."""
    suite = load_suite("cw10-cw")
    return [EnvFactory(suite.family, suite.tasks[task], 25, suite.success_type, seed + i) for i in range(n)]


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs /proc")
def test_metaworld_evaluations_keep_memory_flat_and_scores_fixed() -> None:
    """A matrix row builds and closes every task's eval envs; RSS must come back each time
    (it climbed ~50 MB per CW10 task before the heap was trimmed after each row)."""
    pytest.importorskip("metaworld")
    policy = _Policy(4)
    rows = [_factories(2, 100 * j, task=j) for j in range(2)]
    reused = EvalEnvs(_factories(2, 1234))
    first = evaluate(policy, reused, 2)  # type: ignore[arg-type]

    def row() -> None:
        for factories in rows:
            evaluate(policy, factories, 2)  # type: ignore[arg-type]
        release_memory()

    row()  # warm-up: MuJoCo models and the allocator settle
    before = _rss_mb()
    peak = 0.0
    for _ in range(5):
        row()
        assert evaluate(policy, reused, 2) == first  # type: ignore[arg-type]  (same goals each time)
        peak = max(peak, _rss_mb() - before)
    assert peak < 15.0, f"RSS grew {peak:.1f} MB over 5 matrix rows"
    assert evaluate(policy, _factories(2, 1234), 2) == first  # type: ignore[arg-type]  (reused == fresh)
    reused.close()


def test_smoke_eval_envs_reseed_to_their_factory_state() -> None:
    suite = load_suite("smoke")
    factories = task_factories(suite, suite.tasks[0], 2, 77)
    policy = _Policy(1)
    policy.w = np.zeros((3, 1))
    envs = EvalEnvs(factories)
    runs = [evaluate(policy, envs, 2) for _ in range(3)]  # type: ignore[arg-type]
    assert runs[0] == runs[1] == runs[2] == evaluate(policy, factories, 2)  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs /proc")
def test_rss_levels_off_over_ten_cw10_tasks(tmp_path: Path) -> None:
    """Ten CW10 tasks with the default networks and 8 envs, one rollout each (about 15 minutes):
    from task 2 on, RSS at task starts stays within 50 MB of task 2's level. Before the scheduler
    fixed glibc's mmap threshold it rose 183 MB (933 MB at task 2, 1,116 MB at task 7)."""
    from stable_baselines3.common.callbacks import BaseCallback

    from rl_moe.continual.resolve import RunRequest, resolve
    from rl_moe.continual.scheduler import ContinualScheduler

    class TaskStartRss(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.mb: list[float] = []

        def _on_training_start(self) -> None:
            self.mb.append(_rss_mb())

        def _on_step(self) -> bool:
            return True

    cfg = resolve(RunRequest(suite="cw10-cw", method="topk", tasks=10, steps_per_task=4096, vec_env="dummy",
                             overrides=("eval.n_episodes=2", "eval.matrix_episodes=1")))  # fmt: skip
    rss = TaskStartRss()
    (tmp_path / "run").mkdir()
    ContinualScheduler(cfg, tmp_path / "run", progress=False, callbacks=[rss]).run()
    assert len(rss.mb) == 10
    growth = max(rss.mb[1:]) - rss.mb[1]
    assert growth < 50.0, f"RSS at task starts (MB): {[round(m) for m in rss.mb]}"
