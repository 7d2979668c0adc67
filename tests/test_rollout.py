"""The device-resident rollout collector (rl_moe/algos/rollout.py) against SB3's ``collect_rollouts``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.vec_env import VecEnv

from rl_moe.algos import MoEPPO
from rl_moe.algos.fast import no_distribution_checks
from rl_moe.algos.profiling import count_ops
from rl_moe.algos.rollout import DeviceRolloutCollector
from rl_moe.nn import static_shapes
from rl_moe.policies import MoEActorCriticPolicy

SMALL = dict(n_experts=4, top_k=2, hidden=(32, 32), gate_hidden=(16,))
#: Every array the rollout writes (SB3's ``RolloutBuffer``), in its (T, n_envs, ...) layout.
ARRAYS = ("observations", "actions", "rewards", "episode_starts", "values", "log_probs", "advantages", "returns")


def _pendulum() -> VecEnv:
    return make_vec_env("Pendulum-v1", n_envs=2, seed=0)  # 200-step episodes end by time limit


def _metaworld() -> VecEnv:
    from rl_moe.continual.envs import make_vec_env as make_task_env, task_factories
    from rl_moe.continual.resolve import RunRequest, resolve, suite_of

    suite = suite_of(resolve(RunRequest(suite="cw10", method="topk", tasks=1, device="cpu")))
    return make_task_env(task_factories(suite, suite.tasks[0], 2, 0), "dummy")  # 500-step episodes


def _ppo(fast: str, env: VecEnv, n_steps: int, **kwargs) -> MoEPPO:
    return MoEPPO(
        MoEActorCriticPolicy, env, regularizers=[], fast_update=fast, n_steps=n_steps, batch_size=64, n_epochs=1,
        seed=0, device="cpu", policy_kwargs=dict(moe="topk", **SMALL), **kwargs,
    )  # fmt: skip


class _StopAt(BaseCallback):
    """Stops the rollout at its ``stop``-th step (None: never)."""

    def __init__(self, stop: int | None = None) -> None:
        super().__init__()
        self.stop = stop

    def _on_step(self) -> bool:
        return self.stop is None or self.n_calls < self.stop


def _collect(model: MoEPPO, n_steps: int, callback: BaseCallback | None = None) -> bool:
    _, cb = model._setup_learn(n_steps * model.n_envs, callback)
    return model.collect_rollouts(model.env, cb, model.rollout_buffer, n_steps)  # type: ignore[arg-type]


@contextmanager
def _sb3_loop_forbidden() -> Iterator[None]:
    """Fail if SB3's own ``collect_rollouts`` runs (so a comparison compares two loops)."""
    original = OnPolicyAlgorithm.collect_rollouts

    def forbidden(*args, **kwargs):  # noqa: ANN002, ANN003
        raise AssertionError("SB3's collect_rollouts ran instead of the collector")

    OnPolicyAlgorithm.collect_rollouts = forbidden  # type: ignore[method-assign]
    try:
        yield
    finally:
        OnPolicyAlgorithm.collect_rollouts = original  # type: ignore[method-assign]


@pytest.mark.parametrize("make_env, n_steps", [(_pendulum, 256), (_metaworld, 512)], ids=["pendulum", "metaworld"])
def test_collector_fills_the_buffer_bit_identically_to_sb3(make_env: Callable[[], VecEnv], n_steps: int) -> None:
    """Same seed, one rollout each, episodes ending by time limit inside it (the bootstrapped rewards)."""
    sb3 = _ppo("off", make_env(), n_steps)
    assert sb3._rollout_collector() is None
    assert _collect(sb3, n_steps)
    ours = _ppo("on", make_env(), n_steps)
    assert isinstance(ours._rollout_collector(), DeviceRolloutCollector)
    with _sb3_loop_forbidden():
        assert _collect(ours, n_steps)
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(ours.rollout_buffer, name), getattr(sb3.rollout_buffer, name), err_msg=name)
    assert sb3.rollout_buffer.episode_starts[1:].any()  # an episode ended inside the rollout
    assert ours.num_timesteps == sb3.num_timesteps == n_steps * 2
    assert ours.rollout_buffer.full and ours.rollout_buffer.pos == n_steps
    np.testing.assert_array_equal(ours._last_obs, sb3._last_obs)
    np.testing.assert_array_equal(ours._last_episode_starts, sb3._last_episode_starts)
    assert [(e["r"], e["l"]) for e in ours.ep_info_buffer] == [(e["r"], e["l"]) for e in sb3.ep_info_buffer]


def test_collector_stops_where_a_callback_says_so() -> None:
    sb3 = _ppo("off", _pendulum(), 64)  # each seeds the global generators: build, then collect
    assert _collect(sb3, 64, _StopAt(10)) is False
    ours = _ppo("on", _pendulum(), 64)
    assert _collect(ours, 64, _StopAt(10)) is False
    assert ours.num_timesteps == sb3.num_timesteps == 20
    assert ours.rollout_buffer.pos == sb3.rollout_buffer.pos == 9
    for name in ("observations", "actions", "values", "log_probs"):
        np.testing.assert_array_equal(getattr(ours.rollout_buffer, name)[:9], getattr(sb3.rollout_buffer, name)[:9], err_msg=name)


def test_collector_reads_the_device_once_per_step() -> None:
    """Counts the host copies (``Tensor.cpu``) of one 64-step rollout: SB3 copies actions, values
    and log-probabilities every step; the collector copies the actions, and the rest once."""
    counts = {}
    original = torch.Tensor.cpu
    for fast in ("off", "on"):
        model = _ppo(fast, _pendulum(), 64)
        calls = [0]

        def counting(self: torch.Tensor, *args, **kwargs):  # noqa: ANN002, ANN003
            calls[0] += 1
            return original(self, *args, **kwargs)

        torch.Tensor.cpu = counting  # type: ignore[method-assign]
        try:
            _collect(model, 64)
        finally:
            torch.Tensor.cpu = original  # type: ignore[method-assign]
        counts[fast] = calls[0]
    assert counts["off"] >= 3 * 64
    assert 64 <= counts["on"] <= 64 + 3, counts  # + values, log-probs, last values


def test_collector_runs_where_the_fast_update_runs() -> None:
    assert _ppo("auto", _pendulum(), 64)._rollout_collector() is None  # CPU: SB3's loop
    assert _ppo("on", _pendulum(), 64, use_sde=True)._rollout_collector() is None
    model = _ppo("on", _pendulum(), 64)
    collector = model._rollout_collector()
    assert collector is not None and collector is model._rollout_collector()  # kept between rollouts
    assert collector.values.shape == (64, 2)
    assert "_collector" in model._excluded_save_params()


def test_collector_in_the_static_layout_has_no_value_reads() -> None:
    """With the GPU's static MoE layout (here on a CPU) nothing in a rollout step reads a tensor's
    value on the host: the routed dispatch's ``nonzero`` and the distribution checks are gone."""
    model = _ppo("on", _pendulum(), 32)
    model._fast_updater().static = True
    _, cb = model._setup_learn(64, None)
    counts = count_ops(lambda: model.collect_rollouts(model.env, cb, model.rollout_buffer, 32))
    assert counts.ops > 32 * 50
    assert counts.syncs == 0, counts.sync_names
    standard = _ppo("off", _pendulum(), 32)
    _, cb = standard._setup_learn(64, None)
    assert count_ops(lambda: standard.collect_rollouts(standard.env, cb, standard.rollout_buffer, 32)).syncs >= 32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_acting_matches_the_policy() -> None:
    """The replayed policy call gives the eager values and the log-probabilities of its own sampled
    actions, also after the parameters change in place (CUDA only)."""
    model = MoEPPO(
        MoEActorCriticPolicy, _pendulum(), regularizers=[], n_steps=64, batch_size=32, n_epochs=1, seed=0,
        device="cuda", policy_kwargs=dict(moe="topk", **SMALL),
    )  # fmt: skip
    collector = model._rollout_collector()
    assert collector is not None and collector.cuda_graphs
    obs = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    for _ in range(2):
        with torch.no_grad(), static_shapes(True), no_distribution_checks():  # as collect_rollouts runs it
            acted = collector._acting(obs)(obs)
            assert collector._captured is not None
            values, log_prob, _ = model.policy.evaluate_actions(torch.from_numpy(obs).cuda(), acted.actions)
        torch.testing.assert_close(acted.values, values, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(acted.log_probs, log_prob, rtol=1e-5, atol=1e-5)
        with torch.no_grad():
            for p in model.policy.parameters():
                p.add_(0.01)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_rollout_reads_the_device_once_per_step() -> None:
    """A rollout's host syncs grow by one per step: the copy of the actions (CUDA only)."""
    syncs = []
    for n_steps in (16, 64):
        model = MoEPPO(
            MoEActorCriticPolicy, _pendulum(), regularizers=[], n_steps=n_steps, batch_size=16, n_epochs=1, seed=0,
            device="cuda", policy_kwargs=dict(moe="topk", **SMALL),
        )  # fmt: skip
        _collect(model, n_steps)  # captures the graph
        _, cb = model._setup_learn(n_steps * 2, None)
        syncs.append(count_ops(lambda: model.collect_rollouts(model.env, cb, model.rollout_buffer, n_steps)).syncs)
    assert syncs[1] - syncs[0] <= 48, syncs
